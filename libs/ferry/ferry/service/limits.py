"""Limits on what an HTTP client can make a Ferry service hold, shared by every HTTP API.

namesrv, the broker's API, the delay-scheduler, the txn-checker, dedup and the
console all serve aiohttp; each builds one `HttpGuard` from `HttpLimits`
(constants below, each overridable by `FERRY_<SERVICE>_HTTP_<LIMIT>`) and uses
it for its application, runner and listening site. What it bounds, all before
the request reaches a handler (docs/security.md, "Limits"):

- the body (`client_max_size`: reading more is 413);
- the request line and each header line, and the number of headers (aiohttp's
  parser refuses more with 400 and closes the connection, before buffering
  beyond the limit);
- connections open in total and per client address (one more is closed at
  once, without reading from it), and how long an idle keep-alive connection
  stays open.

Every refusal is counted; services show the counts in `/v1/stats` under `limits`.
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, cast

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestHandler

from ferry.service import config as settings
from ferry.service.admission import (
    CONNECTIONS_OVER_PER_ADDR,
    CONNECTIONS_OVER_TOTAL,
    LOG_EVERY_S,
    Admission,
)

log = logging.getLogger(__name__)

#: The HTTP request body limit of every service (the console passes its own, larger: its
#: resend form).
MAX_HTTP_BODY_BYTES = 64 * 1024
#: The request line and each header line (aiohttp's default, named here).
MAX_LINE_BYTES = 8190
MAX_FIELD_BYTES = 8190
#: Headers per request: a browser sends about 20.
MAX_HEADERS = 64
#: Connections open at once, and from one client address.
MAX_CONNECTIONS = 4096
MAX_CONNECTIONS_PER_ADDR = 512
#: An idle keep-alive connection is closed after this (aiohttp's default is an hour).
KEEPALIVE_TIMEOUT_S = 75.0

# The counters of /v1/stats `limits.counts` (the two connection counters are ferry.service.admission's).
BODIES_TOO_LARGE = "bodies_too_large"
BAD_REQUESTS = "bad_requests"  # unparsable, or a line or header count over its limit
COUNTERS = (CONNECTIONS_OVER_TOTAL, CONNECTIONS_OVER_PER_ADDR, BODIES_TOO_LARGE, BAD_REQUESTS)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(frozen=True)
class HttpLimits:
    """The limits of one HTTP API; `from_env` reads `<service prefix>HTTP_<FIELD>`."""

    max_body_bytes: int = MAX_HTTP_BODY_BYTES
    max_line_bytes: int = MAX_LINE_BYTES
    max_field_bytes: int = MAX_FIELD_BYTES
    max_headers: int = MAX_HEADERS
    max_connections: int = MAX_CONNECTIONS
    max_connections_per_addr: int = MAX_CONNECTIONS_PER_ADDR
    keepalive_timeout_s: float = KEEPALIVE_TIMEOUT_S

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            if getattr(self, f.name) <= 0:
                raise ValueError(f"HTTP limit {f.name} must be positive")

    @classmethod
    def from_env(cls, prefix: str, max_body_bytes: int = MAX_HTTP_BODY_BYTES,
                 env: Mapping[str, str] | None = None) -> HttpLimits:
        """The limits for the service whose variables start with `prefix` ("FERRY_DEDUP_")."""
        env = os.environ if env is None else env
        limits = settings.from_env(cls, prefix + "HTTP_", env)
        if not env.get(prefix + "HTTP_MAX_BODY_BYTES", "").strip():
            limits = dataclasses.replace(limits, max_body_bytes=max_body_bytes)
        return limits


class HttpGuard(Admission):
    """Applies one service's HttpLimits to its aiohttp app and counts the refusals
    (connection admission and counters: ferry.service.admission)."""

    def __init__(self, limits: HttpLimits) -> None:
        super().__init__(limits.max_connections, limits.max_connections_per_addr, COUNTERS, log)
        self.limits = limits
        _ParseErrorCounter.install()

    # -- the application -------------------------------------------------------------------

    def application(self, middlewares: list[Any] | None = None) -> web.Application:
        """A web.Application with the body limit, counting refusals ahead of `middlewares`."""
        return web.Application(middlewares=[self.middleware, *(middlewares or [])],
                               client_max_size=self.limits.max_body_bytes)

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Count bodies over the limit, however the service's own middleware answers them."""
        try:
            response = await handler(request)
        except web.HTTPRequestEntityTooLarge:
            self.refuse(BODIES_TOO_LARGE, "body over %d bytes from %s", self.limits.max_body_bytes,
                        request.remote)
            raise
        if response.status == 413:
            self.refuse(BODIES_TOO_LARGE, "body over %d bytes from %s", self.limits.max_body_bytes,
                        request.remote)
        return response

    def runner(self, app: web.Application, **kwargs: Any) -> web.AppRunner:
        """A web.AppRunner whose request parser enforces the line and header limits."""
        lim = self.limits
        return web.AppRunner(app, max_line_size=lim.max_line_bytes,
                             max_field_size=lim.max_field_bytes, max_headers=lim.max_headers,
                             keepalive_timeout=lim.keepalive_timeout_s, **kwargs)

    async def start_site(self, runner: web.AppRunner, host: str, port: int,
                         **kwargs: Any) -> LimitedSite:
        """Listen on host:port, admitting connections under the connection limits."""
        site = LimitedSite(self, runner, host, port, **kwargs)
        await site.start()
        return site

    def as_json(self) -> dict[str, Any]:
        """The `limits` section of /v1/stats."""
        return {"settings": dataclasses.asdict(self.limits), "connections": self.open_connections,
                "client_addresses": self.client_addresses, "counts": dict(self.counts)}


class LimitedSite(web.TCPSite):
    """A TCPSite whose connections pass the guard's connection limits first."""

    def __init__(self, guard: HttpGuard, runner: web.AppRunner, host: str, port: int,
                 **kwargs: Any) -> None:
        kwargs.setdefault("reuse_address", True)
        super().__init__(runner, host, port, **kwargs)
        self._guard = guard
        self._listen = (host, port, kwargs)

    async def start(self) -> None:
        await web.BaseSite.start(self)  # registers the site with its runner
        server = self._runner.server
        assert server is not None
        host, port, kwargs = self._listen
        self._server = await asyncio.get_running_loop().create_server(
            lambda: _Gate(self._guard, server), host, port, ssl=kwargs.get("ssl_context"),
            backlog=kwargs.get("backlog", 128), reuse_address=kwargs["reuse_address"])

    @property
    def port(self) -> int:
        """The port listened on (the one chosen when 0 was asked)."""
        assert self._server is not None
        return int(cast(asyncio.Server, self._server).sockets[0].getsockname()[1])


class _Gate(asyncio.Protocol):
    """Admits one connection under the limits, then hands every event to aiohttp's handler."""

    __slots__ = ("_guard", "_server", "_inner", "_host")

    def __init__(self, guard: HttpGuard, server: Callable[[], asyncio.Protocol]) -> None:
        self._guard = guard
        self._server = server
        self._inner: asyncio.Protocol | None = None
        self._host = ""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        peer = transport.get_extra_info("peername")
        host = str(peer[0]) if peer else ""
        refused = self._guard.admit(host)
        if refused is not None:
            self._guard.refuse(refused, "refusing an HTTP connection from %s", host)
            cast(asyncio.Transport, transport).abort()
            return
        self._host = host
        self._inner = _counting_handler(self._server, self._guard)
        self._inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self._inner is not None:
            self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received() if self._inner is not None else None

    def pause_writing(self) -> None:
        if self._inner is not None:
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        if self._inner is not None:
            self._inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._inner is not None:
            self._guard.release(self._host)
            inner, self._inner = self._inner, None
            inner.connection_lost(exc)


class _CountingHandler(RequestHandler):
    """aiohttp's connection handler, counting the requests its parser refused.

    aiohttp answers an unparsable request, or one over a line or header limit,
    with 400 through `handle_error` before any middleware runs.
    """

    __slots__ = ("_guard",)

    def __init__(self, guard: HttpGuard, server: Any, **kwargs: Any) -> None:
        super().__init__(server, **kwargs)
        self._guard = guard

    def handle_error(self, request: Any, status: int = 500, exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        if status == 400:
            self._guard.counts[BAD_REQUESTS] += 1
        return super().handle_error(request, status, exc, message)


def _counting_handler(server: Callable[[], asyncio.Protocol],
                      guard: HttpGuard) -> asyncio.Protocol:
    """A `_CountingHandler` made as aiohttp's Server would; its own if that cannot be."""
    loop, kwargs = getattr(server, "_loop", None), getattr(server, "_kwargs", None)
    if loop is None or kwargs is None:  # another aiohttp: serve, uncounted
        return server()
    return _CountingHandler(guard, server, loop=loop, **kwargs)


class _ParseErrorCounter(logging.Filter):
    """Quiets aiohttp's log of refused requests: one line per LOG_EVERY_S.

    aiohttp logs each request its parser refused with a traceback: under a flood
    that would fill the disk. Crashes (500s) are still logged in full.
    """

    _installed: _ParseErrorCounter | None = None

    def __init__(self) -> None:
        super().__init__()
        self._passed_at = 0.0

    @classmethod
    def install(cls) -> None:
        if cls._installed is None:
            cls._installed = cls()
            logging.getLogger("aiohttp.server").addFilter(cls._installed)

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if not isinstance(exc, HttpProcessingError):
            return True
        now = time.monotonic()
        if now - self._passed_at >= LOG_EVERY_S:
            self._passed_at = now
            return True
        return False
