"""The delay scheduler, the txn-checker and dedup with FERRY_AUTH=on, as real processes.

Each guards every route but its probes and OpenAPI document: unsigned, wrongly
signed, replayed and stale requests are refused (401), a signed request needs
its route's permission (403), and a valid client is served all along. The
services sign their own namesrv calls (FERRY_ACCESS_KEY), or they would not
start: namesrv runs with auth on too.
"""
from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import aiohttp
import pytest
from ferry.auth.credentials import Credentials
from ferry.auth.http import client_session
from ferry.service.auth import RouteTable
from ferry_dedup.api import build_app as dedup_app
from ferry_dedup.permissions import ROUTES as DEDUP_ROUTES
from ferry_delay_scheduler.api import build_app as scheduler_app
from ferry_delay_scheduler.permissions import ROUTES as SCHEDULER_ROUTES
from ferry_txn_checker.api import build_app as checker_app
from ferry_txn_checker.permissions import ROUTES as CHECKER_ROUTES

from tests.auth.http_support import (
    ADMIN,
    NOBODY,
    OPERATOR,
    PUBLISHER,
    READER,
    assert_refusals,
    auth_env,
    guarded_routes,
    seed,
    uncovered_routes,
)
from tests.client.conftest import Mesh
from tests.dedup.conftest import start_dedup
from tests.delay_scheduler.conftest import start_scheduler
from tests.support.procs import Etcd, Proc, Redis
from tests.txn_checker.conftest import start_txn_checker

pytestmark = pytest.mark.integration


@dataclass
class Services:
    """Base URLs of the secured services."""

    scheduler: str
    checker: str
    dedup: str


@pytest.fixture(scope="module")
def services(etcd: Etcd, redis_server: Redis,
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[Services]:
    mesh = Mesh(etcd, tmp_path_factory.mktemp("auth-services"), credentials=ADMIN)
    seed(etcd.endpoint, mesh.prefix)
    env = auth_env(etcd.endpoint, mesh.prefix)
    mesh.namesrv_env = env
    procs: list[Proc] = []
    try:
        mesh.start_namesrv()
        scheduler = start_scheduler(mesh, "scheduler", env=env)
        procs.append(scheduler.proc)
        checker = start_txn_checker(mesh, env={
            **env, "FERRY_TXN_CHECKER_ETCD_PREFIX": mesh.prefix})
        procs.append(checker.proc)
        dedup = start_dedup(mesh, redis_server.url, mesh.workdir / "dedup", env={
            **env, "FERRY_DEDUP_ETCD": etcd.endpoint, "FERRY_DEDUP_ETCD_PREFIX": mesh.prefix})
        procs.append(dedup.proc)
        yield Services(f"http://127.0.0.1:{scheduler.http_port}",
                       f"http://127.0.0.1:{checker.http_port}",
                       f"http://127.0.0.1:{dedup.http_port}")
    finally:
        for p in reversed(procs):
            p.stop()
        mesh.stop()


@pytest.fixture
async def plain() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=15)) as session:
        yield session


async def _status(creds: Credentials, method: str, url: str, body: Any = None) -> tuple[int, Any]:
    async with client_session(creds, timeout=aiohttp.ClientTimeout(total=15)) as session:
        async with session.request(method, url, json=body) as resp:
            return resp.status, await resp.json(content_type=None)


def test_every_service_route_has_a_rule() -> None:
    nothing = SimpleNamespace(version="0", claim=None, reconcile=None)
    apps: list[tuple[Any, RouteTable]] = [
        (scheduler_app(dict, bool, str, None, "0"), SCHEDULER_ROUTES),  # type: ignore[arg-type]
        (checker_app(None, dict, bool, "0"), CHECKER_ROUTES),  # type: ignore[arg-type]
        (dedup_app(nothing), DEDUP_ROUTES),  # type: ignore[arg-type]
    ]
    for app, table in apps:
        assert uncovered_routes(app, table) == []


@pytest.mark.parametrize("service,table", [("scheduler", SCHEDULER_ROUTES),
                                           ("checker", CHECKER_ROUTES),
                                           ("dedup", DEDUP_ROUTES)])
async def test_every_route_refuses_unsigned_wrong_replayed_and_stale(
        services: Services, plain: aiohttp.ClientSession, service: str,
        table: RouteTable) -> None:
    base = getattr(services, service)
    routes = guarded_routes(table)
    sent = await assert_refusals(plain, base, routes)
    print(f"{service}: {len(routes)} routes, {sent} bad or unpermitted requests answered")
    for path in ("/healthz", "/readyz", "/openapi.json"):
        async with plain.get(base + path) as resp:
            assert resp.status == 200, (service, path)
    status, doc = await _status(READER, "GET", base + "/v1/stats")
    assert status == 200 and isinstance(doc, dict), (service, doc)
    counted = doc["auth"]
    # Every route: unsigned, wrong signature, stale; a read also its replay (a denied
    # write holds no nonce, so sending it again is not a replay: assert_refusals).
    reads = sum(1 for method, _ in routes if method == "GET")
    assert counted["enabled"], counted
    assert counted["refused_unauthenticated"] >= 3 * len(routes) + reads, counted
    assert counted["refused_replay"] >= reads


async def test_permissions_per_route(services: Services) -> None:
    # stats are admin read: a publisher may not look
    for base in (services.scheduler, services.checker, services.dedup):
        status, doc = await _status(PUBLISHER, "GET", base + "/v1/stats")
        assert status == 403 and "read on admin" in doc["error"]["message"], doc
    # cancelling a delayed message is admin delay: a reader may not, the operator may
    url = services.scheduler + "/v1/delayed/" + "0" * 32 + "/cancel"
    status, doc = await _status(READER, "POST", url)
    assert status == 403 and "delay on admin" in doc["error"]["message"]
    status, doc = await _status(OPERATOR, "POST", url)
    assert status == 404, doc   # permitted: the scheduler looked and found nothing
    # the txn-checker's lists: admin read or txn
    status, doc = await _status(READER, "GET", services.checker + "/v1/transactions")
    assert status == 200 and doc["state"] == "open"
    # dedup claims need claim on their scene (tests/dedup/test_scene_rights.py); its
    # ledger is admin read
    claim = {"scene": "billing", "biz_key": "order-1"}
    status, doc = await _status(NOBODY, "POST", services.dedup + "/v1/claims", claim)
    assert status == 403 and "claim on scene:billing" in doc["error"]["message"], doc
    status, doc = await _status(ADMIN, "POST", services.dedup + "/v1/claims", claim)
    assert status == 200 and "state" in doc, doc
    status, doc = await _status(NOBODY, "GET", services.dedup + "/v1/reports")
    assert status == 403
    status, doc = await _status(ADMIN, "GET", services.dedup + "/v1/reports")
    assert status == 200
