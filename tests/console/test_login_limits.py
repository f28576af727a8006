"""The console's login limits with FERRY_AUTH=on, as real processes over plain HTTP.

Failed logins are throttled per client address and per access key (429, the
login page still served, other addresses and identities unaffected);
sessions are bounded per identity, so one identity logging in 1,000+ times
logs nobody else out, and a full console refuses a login instead of ending
someone else's session; the session cookie keeps `Secure` behind a
TLS-terminating proxy. Clients connect from several loopback addresses
(127.0.0.x) to tell them apart, as different machines would be.
"""
from __future__ import annotations

import http.client
import json
import urllib.parse
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pytest
from ferry.auth.credentials import Credentials

from tests.auth.http_support import ADMIN, PUBLISHER, READER, auth_env, seed
from tests.client.conftest import Mesh
from tests.console.test_login import start_secured_console
from tests.support.procs import Etcd, Proc

pytestmark = pytest.mark.integration

COOKIE = "ferry_console_session"


@dataclass
class Answer:
    status: int
    headers: http.client.HTTPMessage
    body: str

    @property
    def cookie(self) -> str:
        """The session cookie's value that this answer set ("" when none)."""
        for header in self.headers.get_all("Set-Cookie") or []:
            name, _, rest = header.partition("=")
            if name == COOKIE:
                return rest.split(";")[0]
        return ""


def _request(base: str, method: str, path: str, *, source: str = "127.0.0.1",
             form: dict[str, str] | None = None, cookie: str = "",
             headers: dict[str, str] | None = None) -> Answer:
    """One request from the loopback address `source`, redirects not followed."""
    url = urllib.parse.urlsplit(base)
    conn = http.client.HTTPConnection(url.hostname or "", url.port, timeout=30,
                                      source_address=(source, 0))
    sent = dict(headers or {})
    body = None
    if form is not None:
        body = urllib.parse.urlencode(form)
        sent["Content-Type"] = "application/x-www-form-urlencoded"
    if cookie:
        sent["Cookie"] = f"{COOKIE}={cookie}"
    try:
        conn.request(method, path, body=body, headers=sent)
        resp = conn.getresponse()
        return Answer(resp.status, resp.headers, resp.read().decode())
    finally:
        conn.close()


def _login(base: str, creds: Credentials, *, source: str = "127.0.0.1",
           headers: dict[str, str] | None = None) -> Answer:
    return _request(base, "POST", "/console/login", source=source, headers=headers,
                    form={"access_key": creds.access_key, "secret": creds.secret_key,
                          "next": "/console/topics"})


def _wrong(creds: Credentials) -> Credentials:
    return Credentials(creds.access_key, "not-the-right-secret-0000")


def _live(base: str, cookie: str) -> bool:
    """Whether `cookie` is a session: a page answers instead of redirecting to the login."""
    answer = _request(base, "GET", "/console/login-check-not-a-page", cookie=cookie)
    return answer.status != 303


@pytest.fixture(scope="module")
def mesh(etcd: Etcd, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mesh]:
    """namesrv with auth on (the console checks logins there); no broker is needed."""
    mesh = Mesh(etcd, tmp_path_factory.mktemp("console-limits"), credentials=ADMIN)
    seed(etcd.endpoint, mesh.prefix)
    mesh.namesrv_env = auth_env(etcd.endpoint, mesh.prefix)
    try:
        mesh.start_namesrv()
        yield mesh
    finally:
        mesh.stop()


@pytest.fixture
def console_of(mesh: Mesh) -> Iterator[object]:
    """Start a console with the given FERRY_CONSOLE_* settings; stopped after the test."""
    procs: list[Proc] = []

    def start(name: str, **env: str) -> str:
        proc, url = start_secured_console(mesh, name, **env)
        procs.append(proc)
        return url

    try:
        yield start
    finally:
        for proc in procs:
            proc.stop()


def test_failed_logins_are_throttled_per_address_and_per_identity(console_of: object) -> None:
    base = console_of("console-throttle",  # type: ignore[operator]
                      FERRY_CONSOLE_LOGIN_FAILURES_PER_ADDRESS="3",
                      FERRY_CONSOLE_LOGIN_FAILURES_PER_IDENTITY="5")
    # one address guesses: three failures, then even the right secret is refused
    for _ in range(3):
        answer = _login(base, _wrong(READER), source="127.0.0.2")
        assert answer.status == 401 and "wrong access key or secret" in answer.body
    for creds in (READER, PUBLISHER):
        answer = _login(base, creds, source="127.0.0.2")
        assert answer.status == 429, answer.body[:300]
        assert "too many failed logins from your address" in answer.body
        assert int(answer.headers["Retry-After"]) >= 1 and answer.cookie == ""
    page = _request(base, "GET", "/console/login", source="127.0.0.2")
    assert page.status == 200 and 'id="login-form"' in page.body, "the page is still served"
    # another address logs in as the same identity (3 failures < its 5)
    answer = _login(base, READER, source="127.0.0.3")
    assert answer.status == 303 and answer.cookie
    # many addresses guess one identity: its budget runs out, another identity's does not
    for source in ("127.0.0.4", "127.0.0.4", "127.0.0.5", "127.0.0.5", "127.0.0.6"):
        assert _login(base, _wrong(ADMIN), source=source).status == 401
    answer = _login(base, ADMIN, source="127.0.0.7")
    assert answer.status == 429 and "for this access key" in answer.body, answer.body[:300]
    answer = _login(base, PUBLISHER, source="127.0.0.7")
    assert answer.status == 303 and answer.cookie
    stats = _request(base, "GET", "/v1/stats", cookie=answer.cookie)
    assert stats.status == 200, stats.body[:300]
    counted = json.loads(stats.body)["login"]
    assert counted["refused_throttled"] == 3 and counted["failed_logins"] == 8, counted
    # guesses sent all at once are counted as they arrive, not once namesrv has answered
    ghost = Credentials("ghost-user", "not-the-right-secret-0000")
    with ThreadPoolExecutor(max_workers=20) as pool:
        statuses = list(pool.map(lambda _: _login(base, ghost, source="127.0.0.8").status,
                                 range(20)))
    assert sorted(statuses) == [401] * 3 + [429] * 17, statuses


def test_1000_logins_of_one_identity_log_no_one_else_out(console_of: object) -> None:
    base = console_of("console-sessions")  # type: ignore[operator]   # defaults: 1000, 10 each
    reader = _login(base, READER).cookie
    assert reader and _live(base, reader)
    first = _login(base, ADMIN).cookie
    last = first
    for _ in range(1001):
        answer = _login(base, ADMIN)
        assert answer.status == 303, answer.body[:300]
        last = answer.cookie
    assert _live(base, reader), "another identity's logins ended the reader's session"
    assert _live(base, last) and not _live(base, first), "the admin's own oldest ended"


def test_a_full_console_refuses_a_login_instead_of_ending_others(console_of: object) -> None:
    base = console_of("console-full",  # type: ignore[operator]
                      FERRY_CONSOLE_MAX_SESSIONS="2",
                      FERRY_CONSOLE_MAX_SESSIONS_PER_IDENTITY="5")
    reader = _login(base, READER).cookie
    publisher = _login(base, PUBLISHER).cookie
    answer = _login(base, ADMIN)
    assert answer.status == 503 and "maximum of 2 sessions" in answer.body, answer.body[:300]
    assert answer.cookie == ""
    assert _live(base, reader) and _live(base, publisher)
    # an identity that holds a session gives up its own oldest
    again = _login(base, READER).cookie
    assert _live(base, again) and not _live(base, reader) and _live(base, publisher)


def test_the_cookie_is_secure_behind_a_tls_terminating_proxy(console_of: object) -> None:
    # plain HTTP to the console, which is only ever reached through an HTTPS proxy
    base = console_of("console-secure-on",  # type: ignore[operator]
                      FERRY_CONSOLE_COOKIE_SECURE="on")
    answer = _login(base, READER)
    assert answer.status == 303
    assert "secure" in _flags(answer), answer.headers.get_all("Set-Cookie")
    # auto: Secure when a trusted proxy says the browser used HTTPS, not when anyone says so
    base = console_of("console-secure-auto",  # type: ignore[operator]
                      FERRY_CONSOLE_TRUSTED_PROXIES="127.0.0.1",
                      FERRY_CONSOLE_LOGIN_FAILURES_PER_ADDRESS="1")
    https = {"X-Forwarded-Proto": "https", "X-Forwarded-For": "203.0.113.9"}
    assert "secure" in _flags(_login(base, READER, headers=https))
    assert "secure" not in _flags(_login(base, READER, source="127.0.0.2", headers=https))
    assert "secure" not in _flags(_login(base, READER))
    # through the proxy, logins are counted by the browser's address, not the proxy's
    assert _login(base, _wrong(READER), headers=https).status == 401
    assert _login(base, READER, headers=https).status == 429
    other = {**https, "X-Forwarded-For": "203.0.113.10"}
    assert _login(base, READER, headers=other).status == 303
    # an untrusted peer cannot pick the address it is counted as
    assert _login(base, _wrong(READER), source="127.0.0.3",
                  headers={"X-Forwarded-For": "203.0.113.11"}).status == 401
    assert _login(base, READER, source="127.0.0.3",
                  headers={"X-Forwarded-For": "203.0.113.12"}).status == 429


def _flags(answer: Answer) -> set[str]:
    """The lower-cased attribute names of the session cookie's Set-Cookie."""
    for header in answer.headers.get_all("Set-Cookie") or []:
        if header.startswith(COOKIE + "="):
            return {part.strip().split("=")[0].lower() for part in header.split(";")[1:]}
    raise AssertionError(f"no session cookie: {answer.status} {answer.body[:200]}")
