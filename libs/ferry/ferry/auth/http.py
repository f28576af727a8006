"""Signed HTTP: the request headers, client-side signing, and the one server middleware.

Every Ferry HTTP API (namesrv, the brokers, delay-scheduler, txn-checker,
dedup) checks requests with `HttpAuth(...).middleware` when `FERRY_AUTH=on`
(the console has its login instead): the signature and the replay guard first (401 `AuthenticationError`), then the route's permission
from the service's table (403 `AccessDeniedError`). `/healthz`, `/readyz` and
`/openapi.json` stay open: probes and tools must reach them without a key.

A signed request carries four headers:

    X-Ferry-Access-Key   the access key
    X-Ferry-Timestamp    ms since the epoch (decimal)
    X-Ferry-Nonce        16 random bytes, 32 lower-case hex characters
    X-Ferry-Signature    HMAC-SHA256 under the signing key, 64 lower-case hex characters

over `signing.string_to_sign_http` (method, raw path, canonical query, body
hash; docs/security.md, "HTTP APIs"). Clients sign through `client_session`
(an aiohttp session whose middleware signs each request as it leaves) or
`signed_url_headers` (urllib and other blocking callers). Optional TLS:
`server_ssl` for the servers, FERRY_TLS_CA for the clients (ferry.auth.tls).
"""
from __future__ import annotations

import os
import re
import ssl
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, urlsplit

import aiohttp
from aiohttp import web
from aiohttp.typedefs import Middleware

from ferry.auth.credentials import ACCESS_KEY_PATTERN, Credentials
from ferry.auth.nonces import ReplayGuard
from ferry.auth.signing import (
    NONCE_BYTES,
    SIGNATURE_BYTES,
    KeyLookup,
    mac,
    mac_matches,
    new_nonce,
    now_ms,
    string_to_sign_http,
)
from ferry.auth.tls import (
    ENV_TLS_CERT,
    ENV_TLS_KEY,
    client_context_from_env,
    server_context,
)
from ferry.errors import AccessDeniedError, AuthenticationError

if TYPE_CHECKING:   # the client side of this module must not pull in etcd
    from ferry.auth.registry import AuthRegistry

HEADER_ACCESS_KEY = "X-Ferry-Access-Key"
HEADER_TIMESTAMP = "X-Ferry-Timestamp"
HEADER_NONCE = "X-Ferry-Nonce"
HEADER_SIGNATURE = "X-Ferry-Signature"
AUTH_HEADERS = (HEADER_ACCESS_KEY, HEADER_TIMESTAMP, HEADER_NONCE, HEADER_SIGNATURE)

#: Paths every service answers without a signature (probes, the API description).
OPEN_PATHS = frozenset({"/healthz", "/readyz", "/openapi.json"})
#: A timestamp header longer than this is not a millisecond time (bounds int parsing).
MAX_TIMESTAMP_DIGITS = 15
_HEX_NONCE = re.compile(f"[0-9a-f]{{{2 * NONCE_BYTES}}}")
_HEX_SIGNATURE = re.compile(f"[0-9a-f]{{{2 * SIGNATURE_BYTES}}}")

#: The authenticated access key of a request that passed the middleware.
ACCESS_KEY = web.RequestKey("ferry_access_key", str)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
#: Whether an access key may do an action on a resource (`Acl.allows`).
AclCheck = Callable[[str, str, str], bool]


# -- the client side ----------------------------------------------------------------------------

def signed_headers(credentials: Credentials, method: str, raw_path: str,
                   query: Iterable[tuple[str, str]], body: bytes, *,
                   ts_ms: int | None = None, nonce: bytes | None = None) -> dict[str, str]:
    """The four headers that sign a request (fresh timestamp and nonce unless given).

    `raw_path` is the path as sent (percent-encoded, no query); `query` the
    decoded (name, value) pairs of the query string.
    """
    ts_ms = now_ms() if ts_ms is None else ts_ms
    nonce_hex = (new_nonce() if nonce is None else nonce).hex()
    data = string_to_sign_http(credentials.access_key, ts_ms, nonce_hex, method, raw_path,
                               query, body)
    return {HEADER_ACCESS_KEY: credentials.access_key, HEADER_TIMESTAMP: str(ts_ms),
            HEADER_NONCE: nonce_hex, HEADER_SIGNATURE: mac(credentials.signing_key, data).hex()}


def signed_url_headers(credentials: Credentials | None, method: str, url: str,
                       body: bytes = b"", *, ts_ms: int | None = None) -> dict[str, str]:
    """The signing headers of a request to `url` as a blocking client (urllib) sends it;
    {} without credentials."""
    if credentials is None:
        return {}
    parts = urlsplit(url)
    return signed_headers(credentials, method, parts.path or "/",
                          parse_qsl(parts.query, keep_blank_values=True), body, ts_ms=ts_ms)


def signing_middleware(credentials: Credentials) -> aiohttp.ClientMiddlewareType:
    """An aiohttp client middleware that signs every request with `credentials`.

    It runs as each request leaves (redirects included), over the URL and body
    aiohttp actually sends, so callers keep using `json=` and `params=`.
    """
    async def sign(request: aiohttp.ClientRequest,
                   handler: aiohttp.ClientHandlerType) -> aiohttp.ClientResponse:
        payload = request.body
        body = b"" if payload == b"" else await payload.as_bytes()  # type: ignore[union-attr]
        request.headers.update(signed_headers(credentials, request.method, request.url.raw_path,
                                              request.url.query.items(), body))
        return await handler(request)

    return sign


def client_session(credentials: Credentials | None, **kwargs: Any) -> aiohttp.ClientSession:
    """An aiohttp session that signs its requests when `credentials` are given, and trusts
    the CA of FERRY_TLS_CA for https:// addresses when it is set."""
    middlewares = (signing_middleware(credentials),) if credentials is not None else ()
    tls = client_context_from_env()
    if tls is not None and "connector" not in kwargs:
        kwargs["connector"] = aiohttp.TCPConnector(ssl=tls)
    return aiohttp.ClientSession(middlewares=middlewares, **kwargs)


def server_ssl(service: str, env: Mapping[str, str] | None = None) -> ssl.SSLContext | None:
    """The TLS context an HTTP API serves with: FERRY_<SERVICE>_TLS_CERT / _KEY, else the
    mesh-wide FERRY_TLS_CERT / FERRY_TLS_KEY; None (plain HTTP) when no certificate is set."""
    env = os.environ if env is None else env
    own = "FERRY_" + service.upper().replace("-", "_") + "_"
    cert = env.get(own + "TLS_CERT", "").strip() or env.get(ENV_TLS_CERT, "").strip()
    key = env.get(own + "TLS_KEY", "").strip() or env.get(ENV_TLS_KEY, "").strip()
    return server_context(cert, key)


# -- the server side ----------------------------------------------------------------------------

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


async def verify_request(request: web.Request, keys: KeyLookup, guard: ReplayGuard) -> str:
    """Check `request`'s signature and freshness; its access key, or AuthenticationError.

    The cheap checks (shape, known key, timestamp window) come before reading
    the body and computing the HMAC; the nonce is remembered only once the
    signature is good, so unsigned junk can neither cost hashing nor fill the guard.
    """
    signed = parse_headers(request)
    key = keys(signed.access_key)
    if key is None:
        raise AuthenticationError(f"unknown or disabled access key {signed.access_key!r}")
    guard.check_time(signed.ts_ms)
    body = await request.read()
    data = string_to_sign_http(signed.access_key, signed.ts_ms, signed.nonce_hex,
                               request.method, request.rel_url.raw_path,
                               request.rel_url.query.items(), body)
    if not mac_matches(key, data, signed.signature):
        raise AuthenticationError(
            f"bad signature for access key {signed.access_key!r} (wrong secret, or the "
            "request was changed on the way)")
    guard.remember(signed.access_key, signed.ts_ms, bytes.fromhex(signed.nonce_hex))
    return signed.access_key


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
    maps the service's routes to permissions. Failures are raised as
    AuthenticationError (401) and AccessDeniedError (403); the service's
    error middleware turns them into its JSON error body. `stats()` counts them.
    """

    def __init__(self, keys: KeyLookup, allows: AclCheck, table: RouteTable,
                 guard: ReplayGuard | None = None,
                 open_paths: frozenset[str] = OPEN_PATHS) -> None:
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
            if request.path in self.open_paths:
                return await handler(request)
            try:
                access_key = await verify_request(request, self.keys, self.guard)
            except AuthenticationError:
                self.unauthenticated += 1
                raise
            try:
                check_permission(access_key, request, self.table, self.allows)
            except AccessDeniedError:
                self.denied += 1
                raise
            request[ACCESS_KEY] = access_key
            return await handler(request)

        return authenticate

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

    def __init__(self, etcd: str, prefix: str, table: RouteTable) -> None:
        # Imported here: the client side of this module must not pull in etcd.
        from ferry.auth.registry import AuthRegistry
        from ferry.routing.registry import EtcdRegistry

        self.etcd = EtcdRegistry(etcd, prefix=prefix)
        self.registry = AuthRegistry(self.etcd)
        self.http = registry_auth(self.registry, table)

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


def registry_auth(registry: AuthRegistry, table: RouteTable) -> HttpAuth:
    """An HttpAuth asking `registry` (a `ferry.auth.registry.AuthRegistry`) for keys and rules.

    `registry.allows` asks the current rules (a reload replaces the registry's ACL).
    """
    return HttpAuth(registry.signing_key, registry.allows, table)


_AUTH_ERROR = {"description": "", "content": {"application/json": {"schema": {
    "type": "object", "required": ["error"], "properties": {"error": {"type": "object"}}}}}}


def document_auth(document: dict[str, Any],
                  open_paths: frozenset[str] = OPEN_PATHS) -> dict[str, Any]:
    """`document` (an OpenAPI 3 document) with the signature headers as its security scheme
    and the 401 / 403 answers on every operation but the open paths (auth on)."""
    doc = {**document, "components": {**document.get("components", {})}}
    doc["components"]["securitySchemes"] = {"ferrySignature": {
        "type": "apiKey", "in": "header", "name": HEADER_SIGNATURE,
        "description": f"with {HEADER_ACCESS_KEY}, {HEADER_TIMESTAMP} and {HEADER_NONCE}: "
                       "HMAC-SHA256 of the request (docs/security.md, HTTP APIs)"}}
    paths: dict[str, Any] = {}
    for path, item in document.get("paths", {}).items():
        if path in open_paths:
            paths[path] = item
            continue
        paths[path] = {key: _secured(op) if isinstance(op, dict) and "responses" in op else op
                       for key, op in item.items()}
    doc["paths"] = paths
    return doc


def _secured(operation: dict[str, Any]) -> dict[str, Any]:
    responses = dict(operation["responses"])
    responses.setdefault("401", {**_AUTH_ERROR, "description": "not authenticated "
                                 "(AuthenticationError)"})
    responses.setdefault("403", {**_AUTH_ERROR, "description": "not permitted "
                                 "(AccessDeniedError)"})
    return {**operation, "responses": responses, "security": [{"ferrySignature": []}]}


def auth_stats(auth: HttpAuth | None) -> dict[str, Any]:
    """The `auth` part of a service's /v1/stats: off, or its refusals and replay guard."""
    return {"enabled": False} if auth is None else {"enabled": True, **auth.stats()}


def access_key_of(request: web.Request) -> str | None:
    """The access key a request was authenticated as (None with auth off)."""
    return request.get(ACCESS_KEY)
