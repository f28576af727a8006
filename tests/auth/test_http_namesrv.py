"""namesrv with FERRY_AUTH=on, as a real process: every route refuses what is not signed,
permissions hold per route, and a valid client is served all along."""
from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from uuid import uuid4

import aiohttp
import pytest
from ferry import Admin
from ferry.auth.credentials import Credentials
from ferry.auth.http import client_session
from ferry.client.core.namesrv import NamesrvClient
from ferry.errors import AccessDeniedError, AuthenticationError
from ferry_namesrv.api import build_app
from ferry_namesrv.permissions import ROUTES

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
from tests.support.procs import Etcd, Proc, start_namesrv

pytestmark = pytest.mark.integration

FERRY = str(Path(sys.executable).with_name("ferry"))


@pytest.fixture(scope="module")
def secured(etcd: Etcd, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A namesrv with auth on over a prefix holding the test identities: its base URL."""
    prefix = f"/auth-{uuid4().hex[:8]}/"
    seed(etcd.endpoint, prefix)
    proc: Proc
    proc, port = start_namesrv(etcd.endpoint, prefix, tmp_path_factory.mktemp("ns-auth"),
                               auth_env(etcd.endpoint, prefix))
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.stop()


@pytest.fixture
async def plain() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=15)) as session:
        yield session


def test_every_namesrv_route_has_a_rule() -> None:
    app = build_app(None, "0")  # type: ignore[arg-type]  # routes only
    assert uncovered_routes(app, ROUTES) == []


async def test_every_route_refuses_unsigned_wrong_replayed_and_stale(
        secured: str, plain: aiohttp.ClientSession) -> None:
    app = build_app(None, "0")  # type: ignore[arg-type]
    routes = guarded_routes((r.method, r.resource.canonical) for r in app.router.routes()
                            if r.method != "HEAD" and r.resource is not None)
    assert ("GET", "/v1/routes/orders") in routes and ("DELETE", "/v1/topics/orders") in routes
    sent = await assert_refusals(plain, secured, routes)
    print(f"namesrv: {len(routes)} routes, {sent} bad or unpermitted requests answered")
    # ... and the probes and the API document stay open, a valid client is served
    for path in ("/healthz", "/readyz", "/openapi.json"):
        async with plain.get(secured + path) as resp:
            assert resp.status == 200, path
    async with plain.get(secured + "/openapi.json") as resp:
        doc = await resp.json()
    assert "ferrySignature" in doc["components"]["securitySchemes"]
    assert {"401", "403"} <= set(doc["paths"]["/v1/topics"]["post"]["responses"])
    assert "401" not in doc["paths"]["/healthz"]["get"]["responses"]
    async with Admin(namesrv=secured.removeprefix("http://"), credentials=ADMIN) as admin:
        assert isinstance(await admin.list_topics(), list)


async def test_permissions_per_route(secured: str) -> None:
    addr = secured.removeprefix("http://")
    topic = f"auth-{uuid4().hex[:6]}"
    async with Admin(namesrv=addr, credentials=ADMIN) as admin:
        await admin.create_topic(topic, queues=2)
        await admin.create_topic("orders", queues=2) if "orders" not in {
            t["name"] for t in await admin.list_topics()} else None
    # A publisher may find its topic's route, nothing else.
    pub = NamesrvClient(addr, credentials=PUBLISHER)
    try:
        route = await pub.get_route("orders")
        assert route.topic == "orders"
        with pytest.raises(AccessDeniedError, match="pub on topic:" + topic):
            await pub.get_route(topic)
        with pytest.raises(AccessDeniedError, match="topics on admin"):
            await pub.call("POST", "/v1/topics", json={"name": "not-mine"})
        with pytest.raises(AccessDeniedError, match="read on admin"):
            await pub.call("GET", "/v1/groups")
        with pytest.raises(AccessDeniedError):
            await pub.call("DELETE", f"/v1/topics/{topic}")
        assert (await pub.call("GET", "/v1/whoami"))["access_key"] == PUBLISHER.access_key
    finally:
        await pub.close()
    # Deny beats allow: the operator holds admin * but not topics.
    async with Admin(namesrv=addr, credentials=OPERATOR) as operator:
        with pytest.raises(AccessDeniedError, match="topics on admin"):
            await operator.create_topic(f"op-{uuid4().hex[:6]}")
        group = f"g-{uuid4().hex[:6]}"
        await operator.create_group(group)
        assert group in {g["name"] for g in await operator.list_groups()}
    # A reader reads, and only reads.
    async with Admin(namesrv=addr, credentials=READER) as reader:
        assert topic in {t["name"] for t in await reader.list_topics()}
        with pytest.raises(AccessDeniedError, match="topics on admin"):
            await reader.delete_topic(topic)
    # Nobody is authenticated but allowed nothing but the open-to-all routes.
    nobody = NamesrvClient(addr, credentials=NOBODY)
    try:
        assert "brokers" in await nobody.call("GET", "/v1/brokers")
        with pytest.raises(AccessDeniedError):
            await nobody.get_route(topic)
    finally:
        await nobody.close()


async def test_an_unsigned_client_gets_a_clear_error(secured: str, tmp_path: Path) -> None:
    async with client_session(None) as session:
        async with session.get(secured + "/v1/topics") as resp:
            assert resp.status == 401
    client = NamesrvClient(secured.removeprefix("http://"))
    client.credentials = None   # as with FERRY_ACCESS_KEY unset
    try:
        with pytest.raises(AuthenticationError, match="not signed"):
            await client.call("GET", "/v1/topics")
    finally:
        await client.close()


def _ferry(secured: str, creds: Credentials | None, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("FERRY_ACCESS_KEY", "FERRY_SECRET_KEY")}
    env["FERRY_NAMESRV"] = secured.removeprefix("http://")
    if creds is not None:
        env["FERRY_ACCESS_KEY"], env["FERRY_SECRET_KEY"] = creds.access_key, creds.secret_key
    return subprocess.run([FERRY, *args], capture_output=True, text=True, timeout=60, env=env,
                          check=False)


def test_the_cli_signs_with_the_callers_identity(secured: str) -> None:
    done = _ferry(secured, READER, "topic", "list")
    assert done.returncode == 0, done.stderr
    done = _ferry(secured, None, "topic", "list")
    assert done.returncode != 0 and "not signed" in done.stderr + done.stdout
    done = _ferry(secured, PUBLISHER, "group", "list")
    assert done.returncode != 0 and "read on admin" in done.stderr + done.stdout
