"""Signed HTTP, the client side: the request headers and signing each request as it leaves.

Every Ferry HTTP API checks these headers when `FERRY_AUTH=on` (the server
side is `ferry.service.auth`). A signature names its target, the service
instance it is for (`service/host:port`): each service announces its own in
the `X-Ferry-Target` header of `GET /healthz` (open), and a client asks once
per address before its first signed request there and keeps the answer
(`target_for`, `fetch_target`). A signed request carries four headers:

    X-Ferry-Access-Key   the access key
    X-Ferry-Timestamp    ms since the epoch (decimal)
    X-Ferry-Nonce        16 random bytes, 32 lower-case hex characters
    X-Ferry-Signature    HMAC-SHA256 under the signing key, 64 lower-case hex characters

over `signing.string_to_sign_http` (target, method, raw path, canonical
query, body hash; docs/security.md, "HTTP APIs"). Clients sign through `client_session`
(an aiohttp session whose middleware signs each request as it leaves) or
`signed_url_headers` (urllib and other blocking callers); https:// addresses
are checked against FERRY_TLS_CA (ferry.auth.tls).
"""
from __future__ import annotations

import time
import urllib.request
from collections.abc import Iterable
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import aiohttp

from ferry.auth.credentials import Credentials
from ferry.auth.signing import mac, new_nonce, now_ms, string_to_sign_http
from ferry.auth.tls import client_context_from_env

HEADER_ACCESS_KEY = "X-Ferry-Access-Key"
HEADER_TIMESTAMP = "X-Ferry-Timestamp"
HEADER_NONCE = "X-Ferry-Nonce"
HEADER_SIGNATURE = "X-Ferry-Signature"
AUTH_HEADERS = (HEADER_ACCESS_KEY, HEADER_TIMESTAMP, HEADER_NONCE, HEADER_SIGNATURE)
#: The response header of `GET /healthz` that names the service instance to sign for.
HEADER_TARGET = "X-Ferry-Target"
#: The open path a client asks a service's target at.
TARGET_PATH = "/healthz"
#: How long an empty answer (a service with auth off) is kept before asking again: a
#: service turned on later is then signed for correctly without restarting its clients.
_EMPTY_TARGET_TTL_S = 30.0
_FETCH_TIMEOUT_S = 5.0

#: origin ("scheme://host:port") -> (target, when learned, monotonic s).
_targets: dict[str, tuple[str, float]] = {}


def _origin(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


def target_for(url: str) -> str | None:
    """The target learned for `url`'s origin, or None when it must be asked (again)."""
    known = _targets.get(_origin(url))
    if known is None:
        return None
    target, learned_s = known
    if not target and time.monotonic() - learned_s > _EMPTY_TARGET_TTL_S:
        return None
    return target


def learn_target(url: str, target: str | None) -> str:
    """Keep `target` (a `X-Ferry-Target` value; None: no header) for `url`'s origin."""
    _targets[_origin(url)] = (target or "", time.monotonic())
    return target or ""


def fetch_target(url: str) -> str:
    """`url`'s service target, asked with a blocking `GET /healthz` when not known yet
    ("" when the service does not answer or runs with auth off)."""
    known = target_for(url)
    if known is not None:
        return known
    probe = _origin(url) + TARGET_PATH
    try:
        with urllib.request.urlopen(probe, timeout=_FETCH_TIMEOUT_S,  # noqa: S310
                                    context=client_context_from_env()) as resp:
            return learn_target(url, resp.headers.get(HEADER_TARGET))
    except OSError:
        return ""   # not kept: the request itself will fail or be refused, and say why


def signed_headers(credentials: Credentials, target: str, method: str, raw_path: str,
                   query: Iterable[tuple[str, str]], body: bytes, *,
                   ts_ms: int | None = None, nonce: bytes | None = None) -> dict[str, str]:
    """The four headers that sign a request to `target` (fresh timestamp and nonce unless
    given).

    `raw_path` is the path as sent (percent-encoded, no query); `query` the
    decoded (name, value) pairs of the query string.
    """
    ts_ms = now_ms() if ts_ms is None else ts_ms
    nonce_hex = (new_nonce() if nonce is None else nonce).hex()
    data = string_to_sign_http(target, credentials.access_key, ts_ms, nonce_hex, method,
                               raw_path, query, body)
    return {HEADER_ACCESS_KEY: credentials.access_key, HEADER_TIMESTAMP: str(ts_ms),
            HEADER_NONCE: nonce_hex, HEADER_SIGNATURE: mac(credentials.signing_key, data).hex()}


def signed_url_headers(credentials: Credentials | None, method: str, url: str,
                       body: bytes = b"", *, ts_ms: int | None = None,
                       target: str | None = None) -> dict[str, str]:
    """The signing headers of a request to `url` as a blocking client (urllib) sends it
    ({} without credentials); `target` defaults to the service's own (`fetch_target`)."""
    if credentials is None:
        return {}
    parts = urlsplit(url)
    return signed_headers(credentials, fetch_target(url) if target is None else target,
                          method, parts.path or "/",
                          parse_qsl(parts.query, keep_blank_values=True), body, ts_ms=ts_ms)


async def _session_target(request: aiohttp.ClientRequest) -> str:
    """The target of `request`'s service, asked once per origin through its own session."""
    url = str(request.url)
    known = target_for(url)
    if known is not None:
        return known
    try:
        async with request.session.get(_origin(url) + TARGET_PATH, middlewares=(),
                                       timeout=aiohttp.ClientTimeout(total=_FETCH_TIMEOUT_S)
                                       ) as resp:
            return learn_target(url, resp.headers.get(HEADER_TARGET))
    except (aiohttp.ClientError, TimeoutError):
        return ""   # not kept: the request itself will fail or be refused, and say why


def signing_middleware(credentials: Credentials) -> aiohttp.ClientMiddlewareType:
    """An aiohttp client middleware that signs every request with `credentials`.

    It runs as each request leaves (redirects included), over the URL and body
    aiohttp actually sends, so callers keep using `json=` and `params=`. The
    first request to an address asks its target first (`GET /healthz`, once).
    """
    async def sign(request: aiohttp.ClientRequest,
                   handler: aiohttp.ClientHandlerType) -> aiohttp.ClientResponse:
        payload = request.body
        body = b"" if payload == b"" else await payload.as_bytes()  # type: ignore[union-attr]
        url = request.url
        target = await _session_target(request)
        request.headers.update(signed_headers(credentials, target, request.method, url.raw_path,
                                              url.query.items(), body))
        resp = await handler(request)
        if resp.status != 401 or not target:
            return resp
        # Another service may answer at this address now (a restart on another port's
        # place): ask again, and sign once more if its target changed.
        _targets.pop(_origin(str(url)), None)
        fresh = await _session_target(request)
        if fresh == target:
            return resp
        resp.release()
        request.headers.update(signed_headers(credentials, fresh, request.method, url.raw_path,
                                              url.query.items(), body))
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
