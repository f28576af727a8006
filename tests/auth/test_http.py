"""Signed HTTP (ferry.auth.http): clients sign what they send, the middleware checks it.

A small aiohttp app on a real socket, with a static key table, stands for a
service; the services' own tests (test_http_services.py) run the real ones.
"""
from __future__ import annotations

import asyncio
import json
import logging
import socket
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import ferry.auth.http as http_module
import pytest
from aiohttp import web
from ferry.auth.acl import Acl, Rule
from ferry.auth.credentials import Credentials
from ferry.auth.http import (
    HEADER_SIGNATURE,
    HEADER_TARGET,
    HEADER_TIMESTAMP,
    client_session,
    fetch_target,
    signed_url_headers,
)
from ferry.auth.signing import now_ms
from ferry.service.auth import AUTHENTICATED, HttpAuth, Permission, access_key_of
from ferry.service.errors import error_middleware, json_response

from tests.auth.http_support import uncovered_routes
from tests.support.procs import free_port

ALICE = Credentials("alice", "alice-secret-0123456789")
BOB = Credentials("bob-1", "bob-secret-0123456789ab")
KEYS = {c.access_key: c.signing_key for c in (ALICE, BOB)}
ACL = Acl({"alice": [Rule("allow", "topic:orders", ("pub",)), Rule("allow", "admin", ("read",))],
           "bob-1": [Rule("allow", "admin", ("*",)), Rule("deny", "admin", ("topics",))]})
TABLE = {
    ("GET", "/v1/routes/{topic}"): (Permission("pub", "topic:{topic}"),
                                    Permission("sub", "topic:{topic}")),
    ("POST", "/v1/topics"): (Permission("topics", "admin"),),
    ("GET", "/v1/stats"): (Permission("read", "admin"),),
    ("GET", "/v1/whoami"): AUTHENTICATED,
}


async def _echo(request: web.Request) -> web.Response:
    body = await request.read()
    return json_response({"who": access_key_of(request), "path": request.path,
                          "query": dict(request.query), "body": body.decode()})


@pytest.fixture
async def server() -> AsyncIterator[tuple[str, HttpAuth]]:
    auth = HttpAuth(KEYS.get, ACL.allows, TABLE)
    app = web.Application(middlewares=[error_middleware((), logging.getLogger("t"), "test"),
                                       auth.middleware])
    for method, path in TABLE:
        app.router.add_route(method, path, _echo)
    app.router.add_get("/healthz", _echo)
    app.router.add_get("/v1/forgotten", _echo)   # a route with no rule: refused
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    base = f"http://127.0.0.1:{port}"
    # The blocking client asks the target once (this server runs on the test's own loop).
    assert await asyncio.to_thread(fetch_target, base) == f"ferry/{socket.gethostname()}:{port}"
    try:
        yield base, auth
    finally:
        await runner.cleanup()


async def _call(session: aiohttp.ClientSession, method: str, url: str,
                **kwargs: Any) -> tuple[int, Any]:
    async with session.request(method, url, **kwargs) as resp:
        return resp.status, await resp.json(content_type=None)


async def test_a_signed_client_passes_with_query_body_and_escaped_path(
        server: tuple[str, HttpAuth]) -> None:
    base, _ = server
    async with client_session(ALICE) as session:
        status, doc = await _call(session, "GET", base + "/v1/routes/orders",
                                  params={"create": "1", "b": "x y/ü"})
        assert status == 200, doc
        assert doc["who"] == "alice" and doc["query"] == {"create": "1", "b": "x y/ü"}
        # admin topics is bob's only denied area; alice has none: 403 naming the need
        status, doc = await _call(session, "POST", base + "/v1/topics", json={"name": "t"})
        assert status == 403 and "topics on admin" in doc["error"]["message"]
    async with client_session(BOB) as session:
        status, doc = await _call(session, "POST", base + "/v1/topics", json={"name": "t"})
        assert status == 403, "deny beats allow"
        status, doc = await _call(session, "GET", base + "/v1/stats")
        assert status == 200 and doc["who"] == "bob-1"
        # an escaped internal name in the path is signed as sent
        status, doc = await _call(session, "GET", base + "/v1/routes/%25RETRY%25g1")
        assert status == 403 and "%RETRY%g1" in doc["error"]["message"]


async def test_every_refusal_is_401_with_its_reason(server: tuple[str, HttpAuth]) -> None:
    base, auth = server
    url = base + "/v1/stats"
    async with aiohttp.ClientSession() as plain:
        status, doc = await _call(plain, "GET", url)
        assert status == 401 and "not signed" in doc["error"]["message"]
        assert doc["error"]["type"] == "AuthenticationError" and doc["error"]["code"] == 26
        good = signed_url_headers(ALICE, "GET", url)
        status, _ = await _call(plain, "GET", url, headers=good)
        assert status == 200
        status, doc = await _call(plain, "GET", url, headers=good)
        assert status == 401 and "replayed" in doc["error"]["message"]
        wrong = signed_url_headers(Credentials("alice", "not-alices-secret-xyz"), "GET", url)
        status, doc = await _call(plain, "GET", url, headers=wrong)
        assert status == 401 and "bad signature" in doc["error"]["message"]
        other_path = signed_url_headers(ALICE, "GET", base + "/v1/whoami")
        status, doc = await _call(plain, "GET", url, headers=other_path)
        assert status == 401 and "bad signature" in doc["error"]["message"]
        stale = dict(good, **{HEADER_TIMESTAMP: str(now_ms() - 120_000)})
        status, doc = await _call(plain, "GET", url, headers=stale)
        assert status == 401 and "stale timestamp" in doc["error"]["message"]
        unknown = signed_url_headers(Credentials("mallory", "mallory-secret-0123456"), "GET", url)
        status, doc = await _call(plain, "GET", url, headers=unknown)
        assert status == 401 and "unknown or disabled access key" in doc["error"]["message"]
        garbled = dict(signed_url_headers(ALICE, "GET", url), **{HEADER_SIGNATURE: "zz"})
        status, doc = await _call(plain, "GET", url, headers=garbled)
        assert status == 401 and "malformed signature" in doc["error"]["message"]
        # probes stay open; a route nobody gave a rule is nobody's
        status, _ = await _call(plain, "GET", base + "/healthz")
        assert status == 200
    async with client_session(BOB) as session:
        status, doc = await _call(session, "GET", base + "/v1/forgotten")
        assert status == 403 and "no permission rule" in doc["error"]["message"]
        status, doc = await _call(session, "GET", base + "/v1/nowhere")
        assert status == 404, "an authenticated caller learns a path does not exist"
    assert auth.stats()["refused_unauthenticated"] == 7
    assert auth.stats()["refused_replay"] == 1


async def test_a_blocking_urllib_client_signs_too(server: tuple[str, HttpAuth]) -> None:
    base, _ = server
    url = base + "/v1/routes/orders?create=1"
    body = json.dumps({"x": 1}).encode()
    req = urllib.request.Request(url, headers=signed_url_headers(ALICE, "GET", url, body),
                                 data=body, method="GET")

    def fetch() -> int:
        with urllib.request.urlopen(req, timeout=5) as resp:  # noqa: S310
            return int(resp.status)

    assert await asyncio.to_thread(fetch) == 200
    assert signed_url_headers(None, "GET", url) == {}


async def test_the_target_is_announced_and_a_signature_for_another_is_refused(
        server: tuple[str, HttpAuth]) -> None:
    base, auth = server
    url = base + "/v1/stats"
    async with aiohttp.ClientSession() as plain:
        async with plain.get(base + "/healthz") as resp:
            target = resp.headers[HEADER_TARGET]
        elsewhere = signed_url_headers(ALICE, "GET", url, target="namesrv/otherhost:9876")
        status, doc = await _call(plain, "GET", url, headers=elsewhere)
        assert status == 401 and "bad signature" in doc["error"]["message"]
        status, _ = await _call(plain, "GET", url,
                                headers=signed_url_headers(ALICE, "GET", url, target=target))
        assert status == 200


async def test_a_session_with_a_stale_target_asks_again_and_signs_once_more(
        server: tuple[str, HttpAuth], monkeypatch: pytest.MonkeyPatch) -> None:
    """Another service now answers at an address the client knew (a restart in another's
    place): the 401 makes the session ask the target again and sign once more."""
    base, auth = server
    monkeypatch.setitem(http_module._targets, base, ("namesrv/elsewhere:1", time.monotonic()))
    async with client_session(ALICE) as session:
        status, doc = await _call(session, "GET", base + "/v1/stats")
    assert status == 200, doc
    assert http_module.target_for(base) == f"ferry/{socket.gethostname()}:{base.rsplit(':', 1)[1]}"
    assert auth.stats()["refused_unauthenticated"] == 1


async def test_a_denied_request_holds_no_nonce(server: tuple[str, HttpAuth]) -> None:
    base, auth = server
    url = base + "/v1/topics"
    before = auth.guard.stats()["nonces"]
    async with aiohttp.ClientSession() as plain:
        denied = signed_url_headers(ALICE, "POST", url, b"{}")
        for _ in range(2):   # refused for its permission both times, never as a replay
            status, doc = await _call(plain, "POST", url, headers=denied, data=b"{}")
            assert status == 403, doc
    assert auth.guard.stats()["nonces"] == before and auth.guard.held_by("alice") == 0


def test_uncovered_routes_lists_what_the_table_misses() -> None:
    app = web.Application()
    app.router.add_get("/v1/stats", _echo)
    app.router.add_get("/v1/extra", _echo)
    app.router.add_get("/healthz", _echo)
    assert uncovered_routes(app, TABLE) == ["GET /v1/extra"]
