"""What the HTTP auth tests share: identities seeded into etcd, and the four refusals.

Every service with FERRY_AUTH=on must refuse a request without credentials,
with a wrong signature, with a replayed nonce and with a stale timestamp
(401, the reason in the message), and keep serving a valid client.
"""
from __future__ import annotations

import asyncio
import re
from collections.abc import Iterable, Mapping
from typing import Any

import aiohttp
from aiohttp import web
from ferry.auth.acl import Rule, admin_rules
from ferry.auth.credentials import Credentials
from ferry.auth.http import signed_url_headers
from ferry.auth.signing import now_ms
from ferry.routing.registry import EtcdRegistry
from ferry.service.auth import OPEN_PATHS, RouteTable
from ferry.service.auth_registry import AuthRegistry

ADMIN = Credentials("admin", "admin-secret-0123456789")
#: No rules at all: authenticated, permitted nothing.
NOBODY = Credentials("nobody", "nobody-secret-0123456789")
#: Publishes to `orders` only.
PUBLISHER = Credentials("pub-orders", "pub-orders-secret-012345")
#: Every admin area but `topics`, which a deny rule takes away again.
OPERATOR = Credentials("operator", "operator-secret-0123456")
#: Looks at stats and queries (admin read) and nothing else.
READER = Credentials("reader", "reader-secret-0123456789")
#: A service identity: what the console itself uses for its rate sampler.
CONSOLE = Credentials("svc-console", "svc-console-secret-01234")
WRONG_SECRET = Credentials("admin", "not-the-admin-secret-000")

RULES: dict[Credentials, tuple[Rule, ...]] = {
    ADMIN: admin_rules(),
    NOBODY: (),
    PUBLISHER: (Rule("allow", "topic:orders", ("pub",)),),
    OPERATOR: (Rule("allow", "admin", ("*",)), Rule("deny", "admin", ("topics",))),
    READER: (Rule("allow", "admin", ("read",)),),
    CONSOLE: (Rule("allow", "admin", ("read",)),),
}
#: Values for path parameters when a test calls every route.
PATH_VALUES = {"topic": "orders", "group": "g-auth", "msg_id": "0" * 32,
               "report_id": "r1", "access_key": "nobody"}
_PARAM = re.compile(r"\{(\w+)\}")


async def seed_identities(etcd: str, prefix: str,
                          rules: Mapping[Credentials, tuple[Rule, ...]] = RULES) -> None:
    """Write the identities and their rules under `prefix` (as `ferry user add` would)."""
    registry = EtcdRegistry(etcd, prefix=prefix)
    await registry.start()
    try:
        auth = AuthRegistry(registry)
        for creds, its_rules in rules.items():
            await auth.add_user(creds.access_key, creds.signing_key, "test", its_rules)
    finally:
        await registry.stop()


def seed(etcd: str, prefix: str) -> None:
    """`seed_identities` from synchronous fixtures."""
    asyncio.run(seed_identities(etcd, prefix))


def auth_env(etcd: str, prefix: str) -> dict[str, str]:
    """FERRY_AUTH=on plus the generic identity a service process signs its own calls with."""
    return {"FERRY_AUTH": "on", "FERRY_ACCESS_KEY": ADMIN.access_key,
            "FERRY_SECRET_KEY": ADMIN.secret_key}


def fill(path: str) -> str:
    """A route path with its parameters filled in."""
    return _PARAM.sub(lambda m: PATH_VALUES[m.group(1)], path)


def guarded_routes(table: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """(method, filled path) of every route a service guards."""
    return sorted((m, fill(p)) for m, p in table if p not in OPEN_PATHS)


async def _call(session: aiohttp.ClientSession, method: str, url: str,
                headers: Mapping[str, str] | None = None) -> tuple[int, Any]:
    async with session.request(method, url, headers=headers, allow_redirects=False) as resp:
        try:
            return resp.status, await resp.json(content_type=None)
        except ValueError:   # a redirect or an HTML page: no JSON
            return resp.status, None


def _refused(status: int, doc: Any, reason: str, what: str) -> None:
    assert status == 401, f"{what}: {status} {doc}"
    err = doc["error"]
    assert err["type"] == "AuthenticationError" and err["code"] == 26, (what, doc)
    assert reason in err["message"], (what, reason, err["message"])


async def assert_refusals(session: aiohttp.ClientSession, base: str,
                          routes: Iterable[tuple[str, str]]) -> int:
    """Send each route the four bad requests; all must be 401 with their reason. The count."""
    sent = 0
    for method, path in routes:
        url = base + path
        what = f"{method} {path}"
        status, doc = await _call(session, method, url)
        _refused(status, doc, "not signed", what + " without credentials")
        status, doc = await _call(session, method, url,
                                  signed_url_headers(WRONG_SECRET, method, url))
        _refused(status, doc, "bad signature", what + " with a wrong signature")
        # Signed by an identity with no rights: authenticated, then 403 (unless the route
        # is open to any identity). A refused request holds no nonce: sent again it is
        # refused the same way; one that passed is refused as a replay.
        once = signed_url_headers(NOBODY, method, url)
        first, doc = await _call(session, method, url, once)
        assert first != 401, (what, doc)
        status, doc = await _call(session, method, url, once)
        if first in (400, 403):   # refused before the handler (a rule may read the body)
            assert status == first, (what + " refused twice", status, doc)
        else:
            _refused(status, doc, "replayed", what + " replayed")
        if method == "GET":   # a read may pass and be replayed
            once = signed_url_headers(ADMIN, method, url)
            status, doc = await _call(session, method, url, once)
            assert status != 401, (what, doc)
            status, doc = await _call(session, method, url, once)
            _refused(status, doc, "replayed", what + " replayed")
        stale = signed_url_headers(ADMIN, method, url, ts_ms=now_ms() - 120_000)
        status, doc = await _call(session, method, url, stale)
        _refused(status, doc, "stale timestamp", what + " with a stale timestamp")
        sent += 5
    return sent


def uncovered_routes(app: web.Application, table: RouteTable,
                     open_paths: frozenset[str] = OPEN_PATHS) -> list[str]:
    """Routes of `app` with no rule in `table` (a test holds every service's list empty)."""
    missing = []
    for route in app.router.routes():
        path = route.resource.canonical if route.resource is not None else ""
        if route.method == "HEAD" or path in open_paths:
            continue
        if (route.method, path) not in table:
            missing.append(f"{route.method} {path}")
    return missing
