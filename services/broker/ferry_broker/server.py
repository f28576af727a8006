"""The wire server: TCP connections, frame decoding, dispatch to handlers, responses.

One `BrokerProtocol` per connection (`connection.py`) feeds received bytes to a sans-IO
`FrameDecoder` and runs each request's handler at once, up to its first wait
(`eager_start.py`); only a handler that waits becomes a task, so a parked PULL
never holds up the SENDs behind it on the same connection. Handlers run their
synchronous part (validation, the store call) before their first await, so
requests on one connection reach the store in the order they arrived. The
answers made while one read is handled leave in one write at its end; an answer
finished later (a woken PULL) goes at once when it is its loop turn's first.

Failure handling, so that no input can stop the broker: a malformed frame
closes only that connection; an unknown code, or a FerryError from a handler,
is an error response; any other exception is logged and answered as
SystemError_. One-way requests get no response, not even an error (it is
logged). The server also sends one-way requests of its own to a client
(`push`: a CHECK_TRANSACTION to a transactional producer).

Limits (limits.py counts each refusal for /v1/stats): `max_connections` and
`max_connections_per_addr` (a connection beyond either is closed at once);
`max_frame_bytes` (the decoder refuses a larger frame from its length prefix,
before buffering it, and the connection closes); `max_inflight_per_conn`
requests per connection (reading pauses beyond it); and
`max_unwritten_bytes_per_conn` of responses made but not yet written to the
socket: past it, and while the peer does not read (the transport paused
writing), no further request of that connection starts, so a client that
stops reading pins a bounded amount of broker memory. Incomplete frames over
64 KiB share `max_pending_frame_bytes` over all connections (a connection past
it waits, unread) and must arrive whole within `frame_timeout_ms` (the sweep
closes a connection whose frame is overdue, whatever paused it).

Idle and stalled connections: the same sweep (one timer per server, not one per
connection or frame) closes a connection that has completed no frame for
`idle_timeout_ms` while none of its requests runs (a parked PULL keeps it), so a
silent socket, a partial header or a half-open peer gives its slot back. With
TLS, the handshake must finish within the same time (asyncio's
`ssl_handshake_timeout`); the connection is only counted once it has.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import ssl
import time

from ferry_broker.auth import BrokerAuth
from ferry_broker.connection import BrokerProtocol
from ferry_broker.context import BrokerContext, Handler
from ferry_broker.limits import CONNECTIONS_IDLE, FRAMES_TOO_SLOW

log = logging.getLogger(__name__)


class BrokerServer:
    """Listens on the wire port and tracks connections and in-flight requests."""

    def __init__(self, ctx: BrokerContext, handlers: dict[int, Handler],
                 auth: BrokerAuth | None = None) -> None:
        self.ctx = ctx
        self.handlers = handlers
        #: Verifies and authorizes each request before it runs; None: auth is off.
        self.auth = auth
        self.connections: set[BrokerProtocol] = set()
        self._ids = itertools.count(1)
        self._server: asyncio.Server | None = None
        self._sweeper: asyncio.TimerHandle | None = None

    async def start(self, host: str, port: int, tls: ssl.SSLContext | None = None) -> None:
        """Listen on host:port; with `tls` every connection speaks TLS first."""
        loop = asyncio.get_running_loop()
        handshake_s = self.ctx.config.idle_timeout_ms / 1000 if tls is not None else None
        self._server = await loop.create_server(self._new_protocol, host, port,
                                                reuse_address=True, backlog=1024, ssl=tls,
                                                ssl_handshake_timeout=handshake_s)
        self._sweeper = loop.call_later(self._sweep_interval_s, self._sweep)
        log.info("wire server listening on %s:%d%s", host, port, " (TLS)" if tls else "")

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    def _new_protocol(self) -> BrokerProtocol:
        return BrokerProtocol(self, next(self._ids))

    @property
    def _sweep_interval_s(self) -> float:
        cfg = self.ctx.config
        return min(1.0, min(cfg.frame_timeout_ms, cfg.idle_timeout_ms) / 4000)

    def _sweep(self) -> None:
        """Close connections whose large frame is overdue (they hold the pending-frame
        budget) and connections idle past `idle_timeout_ms`."""
        timeout_s = self.ctx.config.frame_timeout_ms / 1000
        idle_s = self.ctx.config.idle_timeout_ms / 1000
        now = time.monotonic()
        for conn in list(self.connections):
            if conn.frame_overdue(now, timeout_s):
                self.ctx.limits.refuse(FRAMES_TOO_SLOW, "closing connection %d from %s: a "
                                       "frame of %d bytes not whole after %.0f s",
                                       conn.conn_id, conn.info.peer, conn.reserved_bytes,
                                       timeout_s)
                conn.close()
            elif conn.idle_overdue(now, idle_s):
                self.ctx.limits.refuse(CONNECTIONS_IDLE, "closing connection %d from %s: no "
                                       "frame completed in %.1f s", conn.conn_id,
                                       conn.info.peer, now - conn.last_frame_at)
                conn.close_idle()
        self._sweeper = asyncio.get_running_loop().call_later(self._sweep_interval_s,
                                                              self._sweep)

    def stop_accepting(self) -> None:
        """Close the listening socket and stop reading new requests; in-flight ones go on."""
        if self._server is not None:
            self._server.close()
        if self._sweeper is not None:
            self._sweeper.cancel()
        for conn in list(self.connections):
            conn.stop_reading()

    async def drain(self, timeout_s: float) -> None:
        """Wait for in-flight requests to be answered (at most `timeout_s`), then disconnect."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        while True:  # backlogged requests start as running ones finish
            tasks = [t for conn in self.connections for t in conn.tasks]
            remaining = deadline - asyncio.get_running_loop().time()
            if not tasks or remaining <= 0:
                break
            await asyncio.wait(tasks, timeout=remaining)
        if tasks:
            log.warning("%d requests still running at shutdown; cancelling", len(tasks))
            for task in tasks:
                task.cancel()
        for conn in list(self.connections):
            conn.close()
        if self._server is not None:
            await self._server.wait_closed()
