"""The mesh the HTTP fuzz runs against: every service with an HTTP API, FERRY_AUTH=on.

namesrv, a broker (its HTTP API), the delay-scheduler, the txn-checker, dedup
and the console run as real processes over a real etcd and Redis, with the
identities of tests/auth/http_support.py seeded in etcd. Each `Target` knows
how a valid client reaches it: signed as READER (admin read), or, for the
console, with the cookie of READER's login.
"""
from __future__ import annotations

import json
import sys
import urllib.parse
import urllib.request
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from ferry.auth.http import signed_url_headers
from ferry.service.auth import RouteTable
from ferry_broker.permissions import HTTP_ROUTES as BROKER_ROUTES
from ferry_dedup.permissions import ROUTES as DEDUP_ROUTES
from ferry_delay_scheduler.permissions import ROUTES as SCHEDULER_ROUTES
from ferry_namesrv.permissions import ROUTES as NAMESRV_ROUTES
from ferry_txn_checker.permissions import ROUTES as CHECKER_ROUTES

from tests.auth.http_support import ADMIN, CONSOLE, READER, auth_env, seed
from tests.client.conftest import Mesh
from tests.dedup.conftest import start_dedup
from tests.delay_scheduler.conftest import start_scheduler
from tests.support.procs import Etcd, Proc, Redis, free_port, spawn, wait_until_ready
from tests.txn_checker.conftest import start_txn_checker

#: A failed request is a WARNING line: 20,000 of them would be the run.
QUIET = "ERROR"
COOKIE = "ferry_console_session"
#: Each signed API's route -> permission table (the console has sessions instead).
ROUTE_TABLES: dict[str, RouteTable] = {
    "namesrv": NAMESRV_ROUTES, "broker": BROKER_ROUTES, "delay-scheduler": SCHEDULER_ROUTES,
    "txn-checker": CHECKER_ROUTES, "dedup": DEDUP_ROUTES}


@dataclass
class Target:
    """One service under fuzz, how a valid client reaches it, and what it answered."""

    name: str
    proc: Proc
    port: int
    cookie: str | None = None   # the console: READER's session cookie (name=value)
    statuses: Counter[int] = field(default_factory=Counter)
    garbage: int = 0
    unanswered: int = 0
    elapsed_s: float = 0.0
    served: int = 0
    wrong: list[str] = field(default_factory=list)
    # Coverage of the run: operations of the document never generated, garbage families hit.
    ops_missed: set[tuple[str, str]] = field(default_factory=set)
    garbage_kinds: set[int] = field(default_factory=set)
    auth_kinds: Counter[str] = field(default_factory=Counter)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def anyone(self) -> list[tuple[str, str]]:
        """(method, route) of the routes any identity may call (an empty rule)."""
        table = ROUTE_TABLES.get(self.name, {})
        return [route for route, rule in table.items() if not callable(rule) and not rule]

    def valid_headers(self, method: str, url: str) -> dict[str, str]:
        """What a valid client sends: READER's signature, or its session cookie."""
        if self.cookie is not None:
            return {"Cookie": self.cookie}
        return signed_url_headers(READER, method, url)

    def get_json(self, path: str) -> dict[str, Any]:
        url = self.url + path
        req = urllib.request.Request(url, headers=self.valid_headers("GET", url))
        with urllib.request.urlopen(req, timeout=10) as resp:
            return dict(json.loads(resp.read()))


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def console_login(base: str, access_key: str, secret: str) -> str:
    """Log in to the console as a browser would; the session cookie as `name=value`."""
    form = urllib.parse.urlencode({"access_key": access_key, "secret": secret,
                                   "next": "/console"}).encode()
    req = urllib.request.Request(base + "/console/login", data=form, method="POST")
    try:
        urllib.request.build_opener(_NoRedirect).open(req, timeout=15)
    except urllib.error.HTTPError as answer:   # the 303 to `next`, with the cookie
        with answer:
            cookie = answer.headers.get("Set-Cookie", "")
            assert answer.code == 303 and cookie.startswith(COOKIE), (answer.code, cookie)
            return cookie.split(";")[0]
    raise AssertionError("the console answered a login without a redirect")


def start_console(mesh: Mesh, scheduler: str, checker: str) -> tuple[Proc, int]:
    """The console with auth on and its own identity (the rate sampler's)."""
    port = free_port()
    proc = spawn("console", [sys.executable, "-m", "ferry_console"], mesh.workdir / "console", {
        "FERRY_AUTH": "on", "FERRY_CONSOLE_HTTP_PORT": str(port),
        "FERRY_CONSOLE_NAMESRV": mesh.namesrv, "FERRY_CONSOLE_DELAY_SCHEDULER": scheduler,
        "FERRY_CONSOLE_TXN_CHECKER": checker, "FERRY_CONSOLE_DEDUP": "",
        "FERRY_CONSOLE_RATE_INTERVAL_MS": "1000", "FERRY_CONSOLE_LOG_LEVEL": QUIET,
        "FERRY_CONSOLE_ACCESS_KEY": CONSOLE.access_key,
        "FERRY_CONSOLE_SECRET_KEY": CONSOLE.secret_key})
    wait_until_ready(proc, f"http://127.0.0.1:{port}/readyz", 30.0)
    return proc, port


@pytest.fixture(scope="module")
def targets(etcd: Etcd, redis_server: Redis,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Target]]:
    mesh = Mesh(etcd, tmp_path_factory.mktemp("fuzz-http"), credentials=ADMIN)
    seed(etcd.endpoint, mesh.prefix)
    env = auth_env(etcd.endpoint, mesh.prefix)
    mesh.namesrv_env = {**env, "FERRY_NAMESRV_LOG_LEVEL": QUIET}
    procs: list[Proc] = []
    try:
        mesh.start_namesrv()
        mesh.broker_env = {"FERRY_AUTH": "on", "FERRY_BROKER_LOG_LEVEL": QUIET}
        broker = mesh.start_broker("broker-a")
        scheduler = start_scheduler(mesh, "delay-scheduler", env={
            **env, "FERRY_DELAY_SCHEDULER_LOG_LEVEL": QUIET,
            # A cancel of an unknown id waits this long for it.
            "FERRY_DELAY_SCHEDULER_CANCEL_WAIT_MS": "1"})
        procs.append(scheduler.proc)
        checker = start_txn_checker(mesh, env={**env, "FERRY_TXN_CHECKER_LOG_LEVEL": QUIET,
                                               "FERRY_TXN_CHECKER_ETCD_PREFIX": mesh.prefix})
        procs.append(checker.proc)
        dedup = start_dedup(mesh, redis_server.url, mesh.workdir / "dedup", env={
            **env, "FERRY_DEDUP_LOG_LEVEL": QUIET, "FERRY_DEDUP_ETCD": etcd.endpoint,
            "FERRY_DEDUP_ETCD_PREFIX": mesh.prefix})
        procs.append(dedup.proc)
        console, console_port = start_console(mesh, f"127.0.0.1:{scheduler.http_port}",
                                              f"127.0.0.1:{checker.http_port}")
        procs.append(console)
        assert mesh.namesrv_proc is not None
        cookie = console_login(f"http://127.0.0.1:{console_port}", READER.access_key,
                               READER.secret_key)
        yield [Target("namesrv", mesh.namesrv_proc, mesh.namesrv_port),
               Target("broker", broker.proc, broker.http_port),
               Target("delay-scheduler", scheduler.proc, scheduler.http_port),
               Target("txn-checker", checker.proc, checker.http_port),
               Target("dedup", dedup.proc, dedup.http_port),
               Target("console", console, console_port, cookie=cookie)]
    finally:
        for p in reversed(procs):
            p.stop()
        mesh.stop()
