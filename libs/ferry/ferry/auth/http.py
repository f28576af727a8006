"""Signed HTTP, the client side: the request headers and signing each request as it leaves.

Every Ferry HTTP API checks these headers when `FERRY_AUTH=on` (the server
side is `ferry.service.auth`). A signed request carries four headers:

    X-Ferry-Access-Key   the access key
    X-Ferry-Timestamp    ms since the epoch (decimal)
    X-Ferry-Nonce        16 random bytes, 32 lower-case hex characters
    X-Ferry-Signature    HMAC-SHA256 under the signing key, 64 lower-case hex characters

over `signing.string_to_sign_http` (method, raw path, canonical query, body
hash; docs/security.md, "HTTP APIs"). Clients sign through `client_session`
(an aiohttp session whose middleware signs each request as it leaves) or
`signed_url_headers` (urllib and other blocking callers); https:// addresses
are checked against FERRY_TLS_CA (ferry.auth.tls).
"""
from __future__ import annotations

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
