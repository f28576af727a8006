"""Every console page in headless Chromium against a real mesh: DOM asserts and a screenshot each.

One mesh (two brokers, a delay scheduler, a txn-checker, the console) and one
browser for the module. The data: topic `orders` (25 messages with keys,
tags and properties, one delayed), group `audit` (consumed 20, then 5 more
sent: lag 5), group `billing` (a live member in a child process), group
`payments` whose two messages failed into its DLQ.
"""
from __future__ import annotations

import asyncio
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from ferry import Admin, Consumer, ConsumerRecord, Producer, SendResult
from ferry.telemetry import tracing
from selenium.common.exceptions import StaleElementReferenceException, WebDriverException
from selenium.webdriver.common.by import By
from selenium.webdriver.support.wait import WebDriverWait

from tests.client.util import FAST
from tests.console.conftest import ConsoleMesh, shoot
from tests.support.procs import Proc, spawn

pytestmark = pytest.mark.integration

CHILD = str(Path(__file__).parents[1] / "client" / "consumer_child.py")


@dataclass
class Seeded:
    orders: list[SendResult]
    dead: list[SendResult]
    traced: str
    member: Proc


async def _seed(namesrv: str) -> tuple[list[SendResult], list[SendResult]]:
    async with Admin(namesrv=namesrv) as admin:
        await admin.create_topic("orders", queues=4)
        await admin.create_topic("payments", queues=2)
    async with Producer(namesrv=namesrv) as producer:
        orders = [await producer.send_and_wait(
            "orders", f'{{"order": {i}, "amount": {i * 10}}}'.encode(), key=f"order-{i}",
            tags="new", properties={"amount": str(i * 10), "region": "eu"}) for i in range(20)]
        dead = [await producer.send_and_wait("payments", f"charge {i}".encode(), key=f"pay-{i}")
                for i in range(2)]
    async with Consumer("orders", group="audit", namesrv=namesrv, auto_offset_reset="earliest",
                        **FAST) as consumer:
        got = 0
        deadline = time.monotonic() + 30
        while got < 20 and time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=500)
            got += sum(len(v) for v in batch.values())
        assert got == 20
    async with Producer(namesrv=namesrv) as producer:
        for i in range(20, 25):
            orders.append(await producer.send_and_wait(
                "orders", f'{{"order": {i}}}'.encode(), key=f"order-{i}", tags="late",
                delay_ms=300 if i == 24 else None))
    await _dead_letter(namesrv, len(dead))
    return orders, dead


async def _dead_letter(namesrv: str, count: int) -> None:
    """Group payments fails every message once: with no retries each goes to its DLQ."""
    async def failing(rec: ConsumerRecord) -> None:
        raise RuntimeError("card declined")

    async with Consumer("payments", group="payments", namesrv=namesrv,
                        auto_offset_reset="earliest", max_reconsume_times=0,
                        **FAST) as consumer, Admin(namesrv=namesrv) as admin:
        task = asyncio.ensure_future(consumer.run(failing))
        try:
            deadline = time.monotonic() + 30
            while len(await admin.dead_letters("payments").messages()) < count:
                assert time.monotonic() < deadline, "messages never reached the DLQ"
                await asyncio.sleep(0.2)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


async def _traced(namesrv: str) -> str:
    """A force-traced message on `shipments` whose handler fails once, then succeeds."""
    async with Producer(namesrv=namesrv) as producer:
        sent = await producer.send_and_wait("shipments", b'{"parcel": 7}', key="parcel-7",
                                            trace=True)
    calls: list[int] = []
    done = asyncio.Event()

    async def once_failing(rec: ConsumerRecord) -> None:
        calls.append(rec.reconsume_times)
        if len(calls) == 1:
            raise RuntimeError("label printer offline")
        done.set()

    async with Consumer("shipments", group="shipping", namesrv=namesrv,
                        auto_offset_reset="earliest", retry_backoff_ms=[0], **FAST) as consumer:
        task = asyncio.ensure_future(consumer.run(once_failing))
        try:
            await asyncio.wait_for(done.wait(), 30)
            await asyncio.sleep(1)   # the handler's process span ends after it returns
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    tracing().force_flush()
    return sent.msg_id


@pytest.fixture(scope="module")
def seeded(console_mesh: ConsoleMesh) -> Iterator[Seeded]:
    mesh = console_mesh.mesh
    tracing().shutdown()   # the process's trace-topic target becomes this mesh's namesrv
    orders, dead = asyncio.run(_seed(mesh.namesrv))
    traced = asyncio.run(_traced(mesh.namesrv))
    out = mesh.workdir / "billing.txt"
    member = spawn("billing", [sys.executable, CHILD, mesh.namesrv, "orders", "billing",
                               str(out)], mesh.workdir / "billing")
    deadline = time.monotonic() + 30
    while "assigned" not in (out.read_text() if out.exists() else ""):
        assert time.monotonic() < deadline and member.alive(), member.log()
        time.sleep(0.1)
    yield Seeded(orders, dead, traced, member)
    member.stop()


def _open(driver: Any, url: str) -> None:
    driver.get(url)
    assert "Ferry console" in driver.title, driver.page_source[:500]


def _click(driver: Any, element: Any) -> None:
    """Click a link or submit button and wait until the next page has replaced this one."""
    old = driver.find_element(By.TAG_NAME, "html")
    element.click()

    def replaced(_: Any) -> bool:
        try:
            old.is_enabled()
        except StaleElementReferenceException:
            return True
        except WebDriverException as exc:
            # chromedriver sometimes reports an element of the page being unloaded as an
            # "unhandled inspector error: Node ... does not belong to the document"
            # rather than as stale (CI saw it once); both mean the old page is gone
            if "does not belong to the document" in str(exc) or "No node with given id" in str(exc):
                return True
            raise
        return False

    WebDriverWait(driver, 30).until(replaced)
    WebDriverWait(driver, 30).until(
        lambda d: d.execute_script("return document.readyState") == "complete")


def _cells(driver: Any, table_id: str) -> list[list[str]]:
    rows = driver.find_elements(By.CSS_SELECTOR, f"#{table_id} tbody tr")
    return [[td.text for td in r.find_elements(By.TAG_NAME, "td")] for r in rows]


def _until(check: Any, timeout_s: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.3)


def test_cluster_page(console_mesh: ConsoleMesh, seeded: Seeded, driver: Any, shots: Path) -> None:
    _open(driver, console_mesh.url + "/console")
    rows = driver.find_elements(By.CSS_SELECTOR, "#brokers tbody tr")
    assert sorted(r.get_attribute("data-broker") for r in rows) == ["broker-a", "broker-b"]
    for r in rows:
        assert r.find_element(By.CSS_SELECTOR, ".role").text == "master"
        assert r.find_element(By.CSS_SELECTOR, ".health").text == "healthy"
        assert "%" in r.text   # the disk meter
    assert driver.find_element(By.ID, "broker-count").text == "2"
    shoot(driver, shots, "cluster")


def test_topics_and_a_topic(console_mesh: ConsoleMesh, seeded: Seeded, driver: Any,
                            shots: Path) -> None:
    def orders_row() -> Any:
        _open(driver, console_mesh.url + "/console/topics")
        row = driver.find_element(By.CSS_SELECTOR, '#topics tr[data-topic="orders"]')
        return row if row.find_element(By.CSS_SELECTOR, ".messages").text == "25" else None

    assert _until(orders_row), "orders never showed its 25 messages"
    assert "payments" in driver.find_element(By.ID, "topics").text
    shoot(driver, shots, "topics")
    _click(driver, driver.find_element(By.LINK_TEXT, "orders"))
    assert driver.find_element(By.ID, "topic-name").text == "orders"
    queues = _cells(driver, "queues")
    assert len(queues) == 8 and {q[0] for q in queues} == {"broker-a", "broker-b"}
    assert sum(int(q[3]) for q in queues) == 25
    assert driver.find_element(By.ID, "topic-total").text == "25"
    shoot(driver, shots, "topic")


def test_groups_and_a_group(console_mesh: ConsoleMesh, seeded: Seeded, driver: Any,
                            shots: Path) -> None:
    _open(driver, console_mesh.url + "/console/groups")
    audit = driver.find_element(By.CSS_SELECTOR, '#groups tr[data-group="audit"]')
    assert audit.find_element(By.CSS_SELECTOR, ".lag").text == "5"
    billing = driver.find_element(By.CSS_SELECTOR, '#groups tr[data-group="billing"]')
    assert billing.find_element(By.CSS_SELECTOR, ".members").text == "1"
    shoot(driver, shots, "groups")

    _open(driver, console_mesh.url + "/console/groups/audit")
    assert driver.find_element(By.ID, "total-lag").text == "5"
    lag = _cells(driver, "lag")
    assert len(lag) == 8 and sum(int(r[5]) for r in lag) == 5
    assert all(r[0] == "orders" for r in lag)

    def billing_page() -> bool:
        _open(driver, console_mesh.url + "/console/groups/billing")
        return driver.find_element(By.ID, "member-count").text == "1" and \
            _cells(driver, "lag") != [] and \
            sum(int(r[5]) for r in _cells(driver, "lag")) == 0
    assert _until(billing_page), driver.find_element(By.TAG_NAME, "main").text
    members = _cells(driver, "members")
    # a member also reads its group's retry topic
    assert members[0][1] == "clustering" and members[0][2] == "%RETRY%billing, orders"
    subs = _cells(driver, "subscriptions")
    assert ["orders", "*", members[0][0]] in subs
    shoot(driver, shots, "group")


def test_message_search_and_page(console_mesh: ConsoleMesh, seeded: Seeded, driver: Any,
                                 shots: Path) -> None:
    sent = seeded.orders[3]
    _open(driver, console_mesh.url + "/console/messages")
    form = driver.find_element(By.ID, "search-key")
    form.find_element(By.NAME, "topic").send_keys("orders")
    form.find_element(By.NAME, "key").send_keys("order-3")
    _click(driver, form.find_element(By.TAG_NAME, "button"))
    rows = driver.find_elements(By.CSS_SELECTOR, "#results tbody tr")
    assert [r.get_attribute("data-msg-id") for r in rows] == [sent.msg_id]

    _open(driver, console_mesh.url + "/console/messages")
    form = driver.find_element(By.ID, "search-time")
    form.find_element(By.NAME, "topic").send_keys("orders")
    _click(driver, form.find_element(By.TAG_NAME, "button"))
    ids = {r.get_attribute("data-msg-id")
           for r in driver.find_elements(By.CSS_SELECTOR, "#results tbody tr")}
    assert {r.msg_id for r in seeded.orders[:20]} <= ids
    shoot(driver, shots, "messages")

    _open(driver, console_mesh.url + "/console/messages")
    form = driver.find_element(By.ID, "search-id")
    form.find_element(By.NAME, "id").send_keys(sent.msg_id.lower())
    _click(driver, form.find_element(By.TAG_NAME, "button"))
    _click(driver, driver.find_element(By.LINK_TEXT, sent.msg_id))
    assert driver.find_element(By.ID, "msg-id").text == sent.msg_id
    assert driver.find_element(By.ID, "msg-topic").text == "orders"
    assert driver.find_element(By.ID, "body").text == '{"order": 3, "amount": 30}'
    assert driver.find_element(By.ID, "msg-keys").text == "order-3"
    assert driver.find_element(By.ID, "msg-tags").text == "new"
    props = dict((r[0], r[1]) for r in _cells(driver, "properties"))
    assert props["amount"] == "30" and props["region"] == "eu"
    shoot(driver, shots, "message")


def test_message_trace_timeline(console_mesh: ConsoleMesh, seeded: Seeded, driver: Any,
                                shots: Path) -> None:
    """The traced message's page shows its hops in start order: sent, stored, received,
    failed, retried, received again and processed."""
    def hops() -> list[str]:
        _open(driver, f"{console_mesh.url}/console/messages/{seeded.traced}")
        rows = driver.find_elements(By.CSS_SELECTOR, "#timeline tr.hop")
        found = [r.get_attribute("data-hop") for r in rows]
        return found if found.count("process") == 2 else []
    found = _until(hops, 30)
    assert found, driver.find_element(By.TAG_NAME, "main").text
    # the retry hop has a span at the client (its nack) and one at the broker (the send-back)
    path = [h for h in found if h in ("send", "receive", "process", "retry")]
    path = [h for i, h in enumerate(path) if i == 0 or h != path[i - 1]]
    assert path == ["send", "receive", "process", "retry", "receive", "process"], found
    assert found.index("store") < found.index("receive"), found
    outcomes = [r.find_element(By.CSS_SELECTOR, ".outcome").text
                for r in driver.find_elements(By.CSS_SELECTOR, '#timeline tr[data-hop="process"]')]
    assert outcomes == ["failed", "ok"], outcomes
    assert len(driver.find_elements(By.CSS_SELECTOR, "#timeline .bar")) == len(found)
    assert driver.find_elements(By.CSS_SELECTOR, "#timeline .bar.failed")
    shoot(driver, shots, "trace")


def test_a_delayed_message_is_found_in_its_topic_once_due(console_mesh: ConsoleMesh,
                                                         seeded: Seeded, driver: Any) -> None:
    delayed = seeded.orders[24]

    def delivered() -> bool:
        _open(driver, f"{console_mesh.url}/console/messages/{delayed.msg_id}")
        return "orders" in {r[0] for r in _cells(driver, "copies")}
    assert _until(delivered), _cells(driver, "copies")
    assert driver.find_element(By.ID, "msg-topic").text == "orders"
    assert driver.find_element(By.ID, "msg-keys").text == "order-24"


def test_dlq_and_resend(console_mesh: ConsoleMesh, seeded: Seeded, driver: Any,
                        shots: Path) -> None:
    _open(driver, console_mesh.url + "/console/groups/payments/dlq")
    rows = driver.find_elements(By.CSS_SELECTOR, "#dlq tbody tr")
    assert sorted(r.get_attribute("data-msg-id") for r in rows) == \
        sorted(r.msg_id for r in seeded.dead)
    assert all("payments" in r.text and "charge" in r.text for r in rows)
    shoot(driver, shots, "dlq")
    first = seeded.dead[0].msg_id
    driver.find_element(By.CSS_SELECTOR, f'input[name="id"][value="{first}"]').click()
    _click(driver, driver.find_element(By.ID, "resend-selected"))
    assert driver.find_element(By.ID, "resent").text.startswith("Resent 1 message")
    assert "resent=1" in driver.current_url
    # resending one id leaves the DLQ as it is; resending all empties the list
    assert len(driver.find_elements(By.CSS_SELECTOR, "#dlq tbody tr[data-msg-id]")) == 2
    _click(driver, driver.find_element(By.ID, "resend-all"))
    assert driver.find_element(By.ID, "resent").text.startswith("Resent 2 message")
    assert driver.find_element(By.ID, "dlq-empty").is_displayed()

    async def retried() -> list[str]:
        async with Admin(namesrv=console_mesh.mesh.namesrv) as admin:
            found = await admin.query_message(first)
        return [r.stored_topic for r in found]
    topics = _until(lambda: "%RETRY%payments" in asyncio.run(retried())
                    and asyncio.run(retried()))
    assert topics and "%RETRY%payments" in topics   # it went back through the group's retry topic


def test_services_page(console_mesh: ConsoleMesh, seeded: Seeded, driver: Any,
                       shots: Path) -> None:
    _open(driver, console_mesh.url + "/console/services")
    cards = {s.get_attribute("data-service"): s
             for s in driver.find_elements(By.CSS_SELECTOR, "section.service")}
    assert set(cards) == {"Delay scheduler", "Transaction checker", "Dedup"}
    for name in ("Delay scheduler", "Transaction checker"):
        assert cards[name].find_element(By.CSS_SELECTOR, ".state").text == "up"
        assert len(cards[name].find_elements(By.CSS_SELECTOR, "table.stats tr")) > 3
    assert "not configured" in cards["Dedup"].text
    assert "open" in cards["Transaction checker"].text
    shoot(driver, shots, "services")


def test_bad_input_is_an_error_page(console_mesh: ConsoleMesh, driver: Any) -> None:
    for path, status in (("/console/messages/not-an-id", 400),
                         ("/console/messages/" + "0" * 32, 404),
                         ("/console/groups/bad%25name", 400),
                         ("/console/no-such-page", 404)):
        try:
            urllib.request.urlopen(console_mesh.url + path, timeout=10)
            raise AssertionError(f"{path} answered 200")
        except urllib.error.HTTPError as exc:
            assert exc.code == status, (path, exc.code)
            assert "text/html" in exc.headers["Content-Type"]
            exc.close()
    _open(driver, console_mesh.url + "/console/messages/not-an-id")
    assert "32 hex characters" in driver.find_element(By.ID, "error-message").text
    _open(driver, console_mesh.url + "/console/messages?by=key&topic=orders&key=two+words")
    assert "MalformedRequestError" in driver.find_element(By.ID, "search-error").text
    with urllib.request.urlopen(console_mesh.url + "/healthz", timeout=10) as resp:
        assert resp.status == 200


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def test_namesrv_sends_console_to_the_console(console_mesh: ConsoleMesh) -> None:
    opener = urllib.request.build_opener(_NoRedirect)
    with pytest.raises(urllib.error.HTTPError) as caught:
        opener.open(f"http://{console_mesh.mesh.namesrv}/console", timeout=10)
    assert caught.value.code == 302
    assert caught.value.headers["Location"] == "http://127.0.0.1:10927/console"
    caught.value.close()
