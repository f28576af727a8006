"""The console with FERRY_AUTH=on in headless Chromium: every page and action needs a login,
the session cookie is HttpOnly, SameSite=Strict and ends, and pages act with the user's rights.

A mesh of its own: namesrv with auth on (identities from tests/auth/http_support.py),
one broker, the console with FERRY_AUTH=on and its own identity for the rate sampler.
"""
from __future__ import annotations

import asyncio
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from ferry import Admin, Consumer, ConsumerRecord, Producer
from ferry.auth.credentials import Credentials
from ferry_console.api import openapi_document
from ferry_console.login import safe_next
from selenium.webdriver.common.by import By

from tests.auth.http_support import ADMIN, CONSOLE, PUBLISHER, READER, auth_env, seed
from tests.client.conftest import Mesh
from tests.client.util import FAST
from tests.console.conftest import READY_TIMEOUT_S, shoot
from tests.console.test_pages import _click, _open, _until
from tests.support.procs import Etcd, Proc, free_port, spawn, wait_until_ready
from tests.txn_checker.conftest import start_txn_checker

pytestmark = pytest.mark.integration

COOKIE = "ferry_console_session"
#: Every page of the console (from its OpenAPI document), path parameters filled in.
GET_PAGES = sorted(
    p.replace("{topic}", "orders").replace("{group}", "payments").replace("{msg_id}", "0" * 32)
    for p, ops in openapi_document("0")["paths"].items()
    if p.startswith("/console") and "get" in ops and p != "/console/login")


@dataclass
class SecuredConsole:
    mesh: Mesh
    url: str


def start_secured_console(mesh: Mesh, name: str, **env: str) -> tuple[Proc, str]:
    port = free_port()
    full_env = {"FERRY_AUTH": "on", "FERRY_CONSOLE_HTTP_PORT": str(port),
                "FERRY_CONSOLE_NAMESRV": mesh.namesrv, "FERRY_CONSOLE_DELAY_SCHEDULER": "",
                "FERRY_CONSOLE_TXN_CHECKER": "", "FERRY_CONSOLE_DEDUP": "",
                "FERRY_CONSOLE_RATE_INTERVAL_MS": "1000",
                "FERRY_CONSOLE_ACCESS_KEY": CONSOLE.access_key,
                "FERRY_CONSOLE_SECRET_KEY": CONSOLE.secret_key, **env}
    proc = spawn(name, [sys.executable, "-m", "ferry_console"], mesh.workdir / name, full_env)
    wait_until_ready(proc, f"http://127.0.0.1:{port}/readyz", READY_TIMEOUT_S)
    return proc, f"http://127.0.0.1:{port}"


@pytest.fixture(scope="module")
def secured(etcd: Etcd, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecuredConsole]:
    mesh = Mesh(etcd, tmp_path_factory.mktemp("console-auth"), credentials=ADMIN)
    seed(etcd.endpoint, mesh.prefix)
    mesh.namesrv_env = auth_env(etcd.endpoint, mesh.prefix)
    procs: list[Proc] = []
    try:
        mesh.start_namesrv()
        mesh.broker_env = {"FERRY_AUTH": "on"}   # the brokers check the users' rights too
        mesh.start_broker("broker-a")
        asyncio.run(_seed(mesh.namesrv))
        checker = start_txn_checker(mesh, env={**mesh.namesrv_env,
                                               "FERRY_TXN_CHECKER_ETCD_PREFIX": mesh.prefix})
        procs.append(checker.proc)
        console, url = start_secured_console(
            mesh, "console", FERRY_CONSOLE_TXN_CHECKER=f"127.0.0.1:{checker.http_port}")
        procs.append(console)
        yield SecuredConsole(mesh, url)
    finally:
        for p in procs:
            p.stop()
        mesh.stop()


async def _seed(namesrv: str) -> None:
    """Topics orders and payments; one message of payments failed into its group's DLQ."""
    async with Admin(namesrv=namesrv, credentials=ADMIN) as admin:
        await admin.create_topic("orders", queues=2)
        await admin.create_topic("payments", queues=1)
    async with Producer(namesrv=namesrv, credentials=ADMIN) as producer:
        await producer.send_and_wait("payments", b"charge 1", key="pay-1")

    async def failing(rec: ConsumerRecord) -> None:
        raise RuntimeError("card declined")

    async with Consumer("payments", group="payments", namesrv=namesrv, credentials=ADMIN,
                        auto_offset_reset="earliest", max_reconsume_times=0,
                        **FAST) as consumer, Admin(namesrv=namesrv, credentials=ADMIN) as admin:
        task = asyncio.ensure_future(consumer.run(failing))
        try:
            deadline = time.monotonic() + 30
            while not await admin.dead_letters("payments").messages():
                assert time.monotonic() < deadline, "the message never reached the DLQ"
                await asyncio.sleep(0.2)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def _fetch(url: str, *, data: dict[str, str] | None = None,
           cookie: str | None = None) -> tuple[int, dict[str, str], str]:
    """(status, headers, body) without following redirects."""
    body = urllib.parse.urlencode(data).encode() if data is not None else None
    req = urllib.request.Request(url, data=body, method="POST" if data is not None else "GET")
    if cookie is not None:
        req.add_header("Cookie", f"{COOKIE}={cookie}")
    opener = urllib.request.build_opener(_NoRedirect)
    try:
        with opener.open(req, timeout=15) as resp:
            return resp.status, dict(resp.headers), resp.read().decode()
    except urllib.error.HTTPError as err:
        with err:
            return err.code, dict(err.headers), err.read().decode()


def _login_cookie(base: str, creds: Credentials) -> tuple[str, str]:
    """Log in with a plain HTTP client: (cookie value, Set-Cookie header)."""
    status, headers, body = _fetch(base + "/console/login", data={
        "access_key": creds.access_key, "secret": creds.secret_key, "next": "/console/topics"})
    assert status == 303, body[:500]
    assert headers["Location"] == "/console/topics"
    set_cookie = headers["Set-Cookie"]
    value = set_cookie.split(";")[0].split("=", 1)[1]
    return value, set_cookie


def _log_in(driver: Any, creds: Credentials) -> None:
    driver.find_element(By.ID, "access-key").clear()
    driver.find_element(By.ID, "access-key").send_keys(creds.access_key)
    driver.find_element(By.ID, "secret").send_keys(creds.secret_key)
    _click(driver, driver.find_element(By.ID, "login-button"))


def test_every_page_and_action_needs_a_login(secured: SecuredConsole) -> None:
    for path in GET_PAGES:
        status, headers, _ = _fetch(secured.url + path)
        assert status == 303, path
        assert headers["Location"].startswith("/console/login?next="), (path, headers)
    # actions without a session are refused, not done
    for path in ("/console/groups/payments/dlq/resend", "/console/logout"):
        status, _, body = _fetch(secured.url + path, data={"all": "1"})
        assert status == 401 and "Log in first" in body, (path, body[:300])
    # a forged or tampered cookie is no session
    value, _ = _login_cookie(secured.url, READER)
    sid, expires, mac = value.split(".")
    for forged in (f"{sid}.{int(expires) + 10_000_000}.{mac}", f"{sid}.{expires}.{'0' * 64}",
                   f"x{sid[1:]}.{expires}.{mac}", "garbage"):
        status, headers, _ = _fetch(secured.url + "/console/topics", cookie=forged)
        assert status == 303 and "/console/login" in headers["Location"], forged
    status, _, body = _fetch(secured.url + "/console/topics", cookie=value)
    assert status == 200 and "orders" in body
    # the probes stay open
    for path in ("/healthz", "/readyz", "/openapi.json"):
        assert _fetch(secured.url + path)[0] == 200


def test_an_unreadable_login_form_is_a_400_and_the_console_keeps_serving(
        secured: SecuredConsole) -> None:
    # a multipart body without its boundary (found by tests/fuzz: it was a 500)
    req = urllib.request.Request(secured.url + "/console/login", data=b"access_key=x",
                                 method="POST",
                                 headers={"Content-Type": "multipart/form-data"})
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(req, timeout=15)
    with err.value as resp:
        assert resp.code == 400, resp.read()[:300]
    _login_cookie(secured.url, READER)


def test_the_cookie_is_httponly_samesite_strict_and_expires(secured: SecuredConsole) -> None:
    _, set_cookie = _login_cookie(secured.url, READER)
    flags = {f.strip().split("=")[0].lower(): f.strip() for f in set_cookie.split(";")[1:]}
    assert "httponly" in flags and flags["samesite"].lower() == "samesite=strict"
    assert flags["path"] == "Path=/console" and flags["max-age"] == "Max-Age=28800"
    # a console whose sessions last one second: the same cookie is refused after it
    # (and holds one session at most: a second login ends the first)
    proc, url = start_secured_console(secured.mesh, "console-short",
                                      FERRY_CONSOLE_SESSION_TTL_MS="1000",
                                      FERRY_CONSOLE_MAX_SESSIONS="1")
    try:
        first, _ = _login_cookie(url, READER)
        value, _ = _login_cookie(url, READER)
        assert _fetch(url + "/console/topics", cookie=first)[0] == 303
        assert _fetch(url + "/console/topics", cookie=value)[0] == 200
        time.sleep(1.2)
        status, headers, _ = _fetch(url + "/console/topics", cookie=value)
        assert status == 303 and "/console/login" in headers["Location"]
    finally:
        proc.stop()


def test_after_login_only_console_paths_are_followed() -> None:
    assert safe_next("/console/groups/g?x=1") == "/console/groups/g?x=1"
    for bad in ("https://evil.example/console", "//evil.example/console", "/elsewhere",
                "/console\\..\\x", "", None, "/console" + "x" * 600):
        assert safe_next(bad) == "/console", bad


def test_login_in_the_browser_then_logout(secured: SecuredConsole, driver: Any,
                                          shots: Path) -> None:
    driver.delete_all_cookies()
    _open(driver, secured.url + "/console/topics")
    assert "/console/login" in driver.current_url
    assert driver.find_element(By.ID, "login-form").is_displayed()
    shoot(driver, shots, "login")
    # a wrong secret: refused, no cookie
    _log_in(driver, Credentials(READER.access_key, "not-the-readers-secret"))
    assert "wrong access key or secret" in driver.find_element(By.ID, "login-error").text
    assert driver.get_cookie(COOKIE) is None
    _log_in(driver, READER)
    assert driver.current_url.endswith("/console/topics"), driver.current_url
    assert driver.find_element(By.ID, "user").text == READER.access_key
    assert "orders" in driver.find_element(By.TAG_NAME, "main").text
    cookie = driver.get_cookie(COOKIE)
    assert cookie["httpOnly"] is True and cookie["sameSite"] == "Strict" and "expiry" in cookie
    assert driver.execute_script("return document.cookie") == "", "scripts cannot read it"
    _open(driver, secured.url + "/console/cluster")
    assert "broker-a" in driver.find_element(By.TAG_NAME, "main").text
    _open(driver, secured.url + "/console/services")
    assert driver.find_element(By.CSS_SELECTOR, "main .state").text == "up"   # the checker
    _click(driver, driver.find_element(By.ID, "logout-button"))
    assert "/console/login" in driver.current_url and driver.get_cookie(COOKIE) is None
    _open(driver, secured.url + "/console/cluster")
    assert "/console/login" in driver.current_url


def test_pages_act_with_the_users_rights(secured: SecuredConsole, driver: Any,
                                         shots: Path) -> None:
    driver.delete_all_cookies()
    _open(driver, secured.url + "/console/topics")
    _log_in(driver, PUBLISHER)   # may publish to orders; may not list topics (admin read)
    message = driver.find_element(By.ID, "error-message").text
    assert "AccessDeniedError" in message and "read on admin" in message, message
    shoot(driver, shots, "login-denied")
    # a service that refuses the user is shown as such, not as down
    _open(driver, secured.url + "/console/services")
    assert driver.find_element(By.CSS_SELECTOR, "main .state").text == "not permitted (HTTP 403)"
    _click(driver, driver.find_element(By.ID, "logout-button"))


async def _publish(namesrv: str, topic: str, creds: Credentials) -> None:
    async with Producer(namesrv=namesrv, credentials=creds) as producer:
        await producer.send_and_wait(topic, b"charted")


def _series(driver: Any, url: str) -> list[str]:
    """The lines the topic chart at `url` draws."""
    _open(driver, url)
    return [p.get_attribute("data-series") for p in driver.find_elements(
        By.CSS_SELECTOR, "#chart-topic-rate path.chart-line")]


def test_charts_are_shown_with_the_users_rights(secured: SecuredConsole, driver: Any,
                                                shots: Path) -> None:
    """The charts come from the console's own samples, but a page shows only those its user
    may read the data of: the publisher of orders (no admin read, so no brokers' stats) sees
    the topic's produce rate and no consume rate, lag, disk or flush chart."""
    asyncio.run(_publish(secured.mesh.namesrv, "orders", PUBLISHER))
    driver.delete_all_cookies()
    _open(driver, secured.url + "/console/topics/orders")
    _log_in(driver, PUBLISHER)
    chart = driver.find_element(By.ID, "chart-topic-rate")
    assert chart.find_element(By.CSS_SELECTOR, ".chart-title").text == "Produce rate of orders"
    assert _until(lambda: _series(driver, secured.url + "/console/topics/orders") == [
        "produced"]), driver.find_element(By.ID, "charts").text
    shoot(driver, shots, "login-charts-publisher")
    for path in ("/console/groups/payments", "/console/cluster"):
        _open(driver, secured.url + path)
        assert driver.find_elements(By.CSS_SELECTOR, "svg.chart") == [], path
    _click(driver, driver.find_element(By.ID, "logout-button"))
    _open(driver, secured.url + "/console/topics/payments")
    _log_in(driver, READER)
    chart = driver.find_element(By.ID, "chart-topic-rate")
    assert chart.find_element(By.CSS_SELECTOR, ".chart-title").text == \
        "Produce and consume rate of payments"
    assert _until(lambda: _series(driver, secured.url + "/console/topics/payments") == [
        "produced", "consumed"]), driver.find_element(By.ID, "charts").text
    for path, chart_id in (("/console/groups/payments", "chart-group-lag"),
                           ("/console/cluster", "chart-disk")):
        _open(driver, secured.url + path)
        assert driver.find_element(By.ID, chart_id).tag_name == "svg", path
    shoot(driver, shots, "login-charts")
    _click(driver, driver.find_element(By.ID, "logout-button"))


def test_actions_run_with_the_users_rights_at_the_broker(secured: SecuredConsole, driver: Any,
                                                         shots: Path) -> None:
    """A reader sees the DLQ (admin read) but may not resend it: the broker refuses the
    console's request made as the reader. The admin may."""
    driver.delete_all_cookies()
    _open(driver, secured.url + "/console/groups/payments/dlq")
    _log_in(driver, READER)
    assert driver.current_url.endswith("/console/groups/payments/dlq"), driver.current_url
    assert len(driver.find_elements(By.CSS_SELECTOR, "#dlq tbody tr[data-msg-id]")) == 1
    _click(driver, driver.find_element(By.ID, "resend-all"))
    message = driver.find_element(By.ID, "error-message").text
    assert "AccessDeniedError" in message, message
    shoot(driver, shots, "login-resend-denied")
    _open(driver, secured.url + "/console/groups/payments/dlq")
    _click(driver, driver.find_element(By.ID, "logout-button"))
    _open(driver, secured.url + "/console/groups/payments/dlq")
    _log_in(driver, ADMIN)
    _click(driver, driver.find_element(By.ID, "resend-all"))
    assert driver.find_element(By.ID, "resent").text.startswith("Resent 1 message")
    _click(driver, driver.find_element(By.ID, "logout-button"))


def test_offset_reset_form_runs_with_the_users_rights(secured: SecuredConsole) -> None:
    """The group page's reset form (issue 25): a reader (admin read) gets the dry-run plan
    but the reset itself is refused at the broker (it needs `reset` on the group) and
    nothing moves; the admin resets, and the group page lists the record with who did it."""
    form = {"topic": "payments", "to": "earliest", "dry_run": "1"}
    reader, _ = _login_cookie(secured.url, READER)
    status, _, body = _fetch(secured.url + "/console/groups/payments", cookie=reader)
    assert status == 200 and 'id="reset-form"' in body and "No offset reset recorded" in body
    status, _, body = _fetch(secured.url + "/console/groups/payments/reset-offsets",
                             data=form, cookie=reader)
    assert status == 200 and "Dry run: nothing changed" in body, body[:500]
    assert 'data-queue="broker-a#0"' in body
    committed_before = body.split('data-queue="broker-a#0"')[1].split("</tr>")[0]
    status, _, body = _fetch(secured.url + "/console/groups/payments/reset-offsets",
                             data={**form, "dry_run": "0"}, cookie=reader)
    assert status == 403 and "AccessDeniedError" in body and "reset" in body, body[:500]
    status, _, body = _fetch(secured.url + "/console/groups/payments/reset-offsets",
                             data={**form, "to": "time", "value": "not a time"}, cookie=reader)
    assert status == 400 and "not a time" in body, body[:500]

    admin, _ = _login_cookie(secured.url, ADMIN)
    status, _, body = _fetch(secured.url + "/console/groups/payments/reset-offsets",
                             data=form, cookie=admin)
    assert status == 200 and body.split('data-queue="broker-a#0"')[1].split("</tr>")[0] == \
        committed_before   # the reader's refused reset changed nothing
    status, headers, _ = _fetch(secured.url + "/console/groups/payments/reset-offsets",
                                data={**form, "dry_run": "0"}, cookie=admin)
    assert status == 303 and headers["Location"] == "/console/groups/payments?reset=payments"
    status, _, body = _fetch(secured.url + headers["Location"], cookie=admin)
    assert status == 200 and 'id="reset-done"' in body
    resets = body.split('id="resets"')[1].split("</table>")[0]
    assert ">admin<" in resets and "payments" in resets and "broker-a#0: 1 → 0" in resets
