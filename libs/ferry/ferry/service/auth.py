"""Signed HTTP, the server side: the one middleware every Ferry HTTP API checks requests with.

With `FERRY_AUTH=on` namesrv, the brokers, delay-scheduler, txn-checker and
dedup check each request with `HttpAuth(...).middleware` (the console has its
login instead): the signature and the replay guard first (401
`AuthenticationError`), then the route's permission from the service's table
(403 `AccessDeniedError`), and only then is the nonce remembered (so a refused
request holds no slot of the guard). A signature names its target, this
service instance (`service/host:port`), announced in the `X-Ferry-Target`
header of `/healthz`. `/healthz`, `/readyz` and `/openapi.json` stay
open: probes and tools must reach them without a key. The headers and the
client side are `ferry.auth.http`; identities come from etcd
(`ferry.service.auth_registry`). Optional TLS: `server_ssl`.
"""
from __future__ import annotations

import os
import re
import socket
import ssl
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Middleware

from ferry.auth.credentials import ACCESS_KEY_PATTERN
from ferry.auth.http import (
    AUTH_HEADERS,
    HEADER_ACCESS_KEY,
    HEADER_NONCE,
    HEADER_SIGNATURE,
    HEADER_TARGET,
    HEADER_TIMESTAMP,
)
from ferry.auth.nonces import ReplayGuard
from ferry.auth.signing import (
    NONCE_BYTES,
    SIGNATURE_BYTES,
    KeyLookup,
    mac_matches,
    string_to_sign_http,
)
from ferry.auth.tls import ENV_TLS_CERT, ENV_TLS_KEY, server_context
from ferry.errors import AccessDeniedError, AuthenticationError
from ferry.routing.registry import EtcdRegistry
from ferry.service.auth_registry import AuthRegistry

#: Paths every service answers without a signature (probes, the API description).
OPEN_PATHS = frozenset({"/healthz", "/readyz", "/openapi.json"})
#: A timestamp header longer than this is not a millisecond time (bounds int parsing).
MAX_TIMESTAMP_DIGITS = 15
_HEX_NONCE = re.compile(f"[0-9a-f]{{{2 * NONCE_BYTES}}}")
_HEX_SIGNATURE = re.compile(f"[0-9a-f]{{{2 * SIGNATURE_BYTES}}}")

#: The authenticated access key of a request that passed the middleware.
ACCESS_KEY = web.RequestKey("ferry_access_key", str)
#: The body the signature covered, kept for a rule that finds its resource in the body
#: (dedup's scene): rules are synchronous, and the body is read once, before them.
SIGNED_BODY = web.RequestKey("ferry_signed_body", bytes)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
#: Whether an access key may do an action on a resource (`Acl.allows`).
AclCheck = Callable[[str, str, str], bool]


def server_ssl(service: str, env: Mapping[str, str] | None = None) -> ssl.SSLContext | None:
    """The TLS context an HTTP API serves with: FERRY_<SERVICE>_TLS_CERT / _KEY, else the
    mesh-wide FERRY_TLS_CERT / FERRY_TLS_KEY; None (plain HTTP) when no certificate is set."""
    env = os.environ if env is None else env
    own = "FERRY_" + service.upper().replace("-", "_") + "_"
    cert = env.get(own + "TLS_CERT", "").strip() or env.get(ENV_TLS_CERT, "").strip()
    key = env.get(own + "TLS_KEY", "").strip() or env.get(ENV_TLS_KEY, "").strip()
    return server_context(cert, key)


@dataclass(frozen=True, slots=True)
class Permission:
    """One way to be allowed a route: `action` on `resource`.

    `resource` may name path parameters in braces (`topic:{topic}`), filled
    from the matched route.
    """

    action: str
    resource: str

    def bind(self, match_info: Mapping[str, str]) -> tuple[str, str]:
        return self.action, self.resource.format_map(match_info)


#: A route's rule: any of these permissions lets the request in; `AUTHENTICATED`
#: (empty) lets any known identity in. A callable picks them by the request (a
#: query flag that asks for more) and returns them bound: (action, resource) pairs.
Bound = Sequence[tuple[str, str]]
Rule = tuple[Permission, ...] | Callable[[web.Request], Bound]
#: (METHOD, route path as registered) -> rule. A route missing here is refused.
RouteTable = Mapping[tuple[str, str], Rule]
AUTHENTICATED: tuple[Permission, ...] = ()


def admin(area: str) -> Permission:
    """The admin permission of one area (`topics`, `groups`, `read`, ...)."""
    return Permission(area, "admin")


def _header(request: web.Request, name: str) -> str:
    value = request.headers.get(name)
    if value is None:
        raise AuthenticationError(f"malformed signature: header {name} is missing")
    return value.strip()


@dataclass(frozen=True, slots=True)
class _Signed:
    access_key: str
    ts_ms: int
    nonce_hex: str
    signature: bytes


def parse_headers(request: web.Request) -> _Signed:
    """The signature headers of `request`, their shapes checked; AuthenticationError says what."""
    if not any(h in request.headers for h in AUTH_HEADERS):
        raise AuthenticationError(
            f"authentication required: the request is not signed (no {HEADER_SIGNATURE} "
            "header); set FERRY_ACCESS_KEY and FERRY_SECRET_KEY, or give the client credentials")
    access_key = _header(request, HEADER_ACCESS_KEY)
    ts = _header(request, HEADER_TIMESTAMP)
    nonce_hex = _header(request, HEADER_NONCE).lower()
    signature = _header(request, HEADER_SIGNATURE).lower()
    if not ACCESS_KEY_PATTERN.fullmatch(access_key):
        raise AuthenticationError(f"malformed signature: {HEADER_ACCESS_KEY} is not an access key")
    if not ts.isdigit() or len(ts) > MAX_TIMESTAMP_DIGITS:
        raise AuthenticationError(f"malformed signature: {HEADER_TIMESTAMP} must be ms since "
                                  "the epoch")
    if not _HEX_NONCE.fullmatch(nonce_hex):
        raise AuthenticationError(f"malformed signature: {HEADER_NONCE} must be "
                                  f"{2 * NONCE_BYTES} hex characters")
    if not _HEX_SIGNATURE.fullmatch(signature):
        raise AuthenticationError(f"malformed signature: {HEADER_SIGNATURE} must be "
                                  f"{2 * SIGNATURE_BYTES} hex characters")
    return _Signed(access_key, int(ts), nonce_hex, bytes.fromhex(signature))


async def verify_request(request: web.Request, target: str, keys: KeyLookup,
                         guard: ReplayGuard) -> _Signed:
    """Check that `request` is signed for `target` (this service instance), fresh and
    authentic; its signature's parts, or AuthenticationError.

    The cheap checks (shape, known key, timestamp window) come before reading
    the body and computing the HMAC. The nonce is not remembered here: the
    caller does it once the permission is checked too.
    """
    signed = parse_headers(request)
    key = keys(signed.access_key)
    if key is None:
        raise AuthenticationError(f"unknown or disabled access key {signed.access_key!r}")
    guard.check_time(signed.ts_ms)
    body = await request.read()
    request[SIGNED_BODY] = body
    data = string_to_sign_http(target, signed.access_key, signed.ts_ms, signed.nonce_hex,
                               request.method, request.rel_url.raw_path,
                               request.rel_url.query.items(), body)
    if not mac_matches(key, data, signed.signature):
        raise AuthenticationError(
            f"bad signature for access key {signed.access_key!r} (wrong secret, signed for "
            f"another service than {target!r}, or the request was changed on the way)")
    return signed


def required(request: web.Request, table: RouteTable) -> Bound:
    """The (action, resource) pairs `request`'s route accepts; empty: any identity (or no route
    matched: the router answers 404/405 after authentication)."""
    resource = request.match_info.route.resource
    if resource is None:
        return ()
    rule = table.get((request.method, resource.canonical))
    if rule is None and request.method == "HEAD":
        rule = table.get(("GET", resource.canonical))
    if rule is None:
        # Fail closed: a route someone added without a rule is nobody's.
        raise AccessDeniedError(f"{request.method} {resource.canonical} has no permission rule")
    if callable(rule):
        return rule(request)
    return [p.bind(request.match_info) for p in rule]


def check_permission(access_key: str, request: web.Request, table: RouteTable,
                     allows: AclCheck) -> None:
    """Raise AccessDeniedError unless `access_key` holds one of the route's permissions."""
    bound = required(request, table)
    if not bound:
        return
    if any(allows(access_key, action, resource) for action, resource in bound):
        return
    wanted = " or ".join(f"{action} on {resource}" for action, resource in bound)
    raise AccessDeniedError(f"access key {access_key!r} may not {request.method} "
                            f"{request.path}: it needs {wanted}")


class HttpAuth:
    """The check every Ferry HTTP API runs with auth on; `middleware` goes inside its error
    middleware.

    `keys` finds an access key's signing key, `allows` asks the ACL, `table`
    maps the service's routes to permissions, `service` names the service in its
    target (`service/host:port`, the port the request came in on). Failures are raised as
    AuthenticationError (401) and AccessDeniedError (403); the service's
    error middleware turns them into its JSON error body. `stats()` counts them.
    """

    def __init__(self, keys: KeyLookup, allows: AclCheck, table: RouteTable,
                 guard: ReplayGuard | None = None,
                 open_paths: frozenset[str] = OPEN_PATHS, *, service: str = "ferry") -> None:
        self.service = service
        self._targets: dict[int, str] = {}   # by local port: one app may serve a few
        self.keys = keys
        self.allows = allows
        self.table = table
        self.guard = guard if guard is not None else ReplayGuard()
        self.open_paths = open_paths
        self.unauthenticated = 0
        self.denied = 0
        self.middleware = self._build()

    def _build(self) -> Middleware:
        @web.middleware
        async def authenticate(request: web.Request, handler: Handler) -> web.StreamResponse:
            target = self.target_of(request)
            if request.path in self.open_paths:
                response = await handler(request)
                response.headers[HEADER_TARGET] = target
                return response
            try:
                signed = await verify_request(request, target, self.keys, self.guard)
            except AuthenticationError:
                self.unauthenticated += 1
                raise
            try:
                check_permission(signed.access_key, request, self.table, self.allows)
            except AccessDeniedError:
                self.denied += 1
                raise
            try:
                self.guard.remember(signed.access_key, signed.ts_ms,
                                    bytes.fromhex(signed.nonce_hex))
            except AuthenticationError:
                self.unauthenticated += 1
                raise
            request[ACCESS_KEY] = signed.access_key
            return await handler(request)

        return authenticate

    def target_of(self, request: web.Request) -> str:
        """This instance's target as `request` reached it: `service/host name:local port`."""
        sockname = request.transport.get_extra_info("sockname") if request.transport else None
        port = sockname[1] if isinstance(sockname, tuple) and len(sockname) >= 2 else 0
        target = self._targets.get(port)
        if target is None:
            target = self._targets[port] = f"{self.service}/{socket.gethostname()}:{port}"
        return target

    def stats(self) -> dict[str, int]:
        """Refusals so far and the replay guard's counters (for /v1/stats `auth`)."""
        return {"refused_unauthenticated": self.unauthenticated, "refused_denied": self.denied,
                **self.guard.stats()}


class ServiceAuth:
    """A service's HTTP auth backed by the identities in etcd: `start()`, `http.middleware`,
    `stop()`.

    For services that do not talk to etcd otherwise (namesrv passes its own
    EtcdRegistry). `start()` raises when etcd does not answer: a service with
    auth on cannot tell anyone apart without it, so it must not come up.
    """

    def __init__(self, etcd: str, prefix: str, table: RouteTable, service: str) -> None:
        self.etcd = EtcdRegistry(etcd, prefix=prefix)
        self.registry = AuthRegistry(self.etcd)
        self.http = registry_auth(self.registry, table, service)

    async def start(self) -> None:
        await self.etcd.start()
        await self.registry.start()

    async def stop(self) -> None:
        await self.registry.stop()
        await self.etcd.stop()


async def start_service_auth(auth: ServiceAuth | None) -> HttpAuth | None:
    """With auth on (`auth` given): load the identities from etcd before the API answers
    anyone, and return the middleware's HttpAuth; None with auth off."""
    if auth is None:
        return None
    await auth.start()
    return auth.http


def registry_auth(registry: AuthRegistry, table: RouteTable, service: str) -> HttpAuth:
    """An HttpAuth for `service` asking `registry` for keys and rules.

    `registry.allows` asks the current rules (a reload replaces the registry's ACL).
    """
    return HttpAuth(registry.signing_key, registry.allows, table, service=service)


def auth_stats(auth: HttpAuth | None) -> dict[str, Any]:
    """The `auth` part of a service's /v1/stats: off, or its refusals and replay guard."""
    return {"enabled": False} if auth is None else {"enabled": True, **auth.stats()}


def access_key_of(request: web.Request) -> str | None:
    """The access key a request was authenticated as (None with auth off)."""
    return request.get(ACCESS_KEY)
