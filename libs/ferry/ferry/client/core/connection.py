"""One multiplexed TCP connection to a broker, and a pool of them by address.

A connection given `credentials` signs every request it sends (header key
`a`, docs/security.md); without them requests go unsigned, as before. A
signature names its target, the broker it is for: on connecting, a connection
with credentials asks the broker which it is (IDENTIFY, unsigned, one round
trip per connection) and folds the answer into every signature after.

Many requests share one connection: each carries a request id, and the
connection's protocol matches every response to the future waiting for it. A
request that gets no answer in time fails alone with RequestTimeoutError; when
the connection drops, exactly the requests still pending fail with
ConnectionLostError. A response with a non-zero error code raises the matching
`ferry.errors` class.

A broker may also send a REQUEST on a client's connection (server to client:
the transaction check-back, CHECK_TRANSACTION). Such a frame goes to the
handler registered for its code (`request_handlers`, given to the connection
or its pool); an unknown code is logged and ignored (answered with
UnknownCodeError unless one-way), and a handler's exception is logged: the
reader never dies of an incoming request.

The connection is an `asyncio.BufferedProtocol` rather than a StreamReader/Writer
pair: received bytes go straight from its reusable buffer to the FrameDecoder (no
intermediate buffer and no reader task to wake), and the frames of requests made in
one loop turn are corked into one socket write (one syscall for many small requests).

A broker closes a connection idle for its `idle_timeout_ms` (60 s); the pool closes
its own sooner (`idle_close_ms`, 45 s) and reopens on the next use, so a request
never races the broker's close (as Kafka keeps clients' `connections.max.idle.ms`
below the broker's). One caught in that race anyway fails retriable (ConnectionLost).
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import ssl
import time
from collections.abc import Callable, Mapping
from typing import Any

from ferry.auth.credentials import Credentials
from ferry.auth.signing import sign_wire
from ferry.auth.tls import client_context_from_env
from ferry.client.core.conn_protocol import ConnProtocol
from ferry.cork import Cork
from ferry.errors import (
    ConnectionLostError,
    FerryError,
    RequestTimeoutError,
    UnknownCodeError,
    error_for_code,
)
from ferry.wire import (
    MAX_FRAME_BYTES,
    Flag,
    Frame,
    FrameDecoder,
    MalformedFrameError,
    RequestCode,
    encode_frame_parts,
    error_response,
)
from ferry.wire import request as make_request

log = logging.getLogger(__name__)

DEFAULT_REQUEST_TIMEOUT_MS = 10_000
DEFAULT_CONNECT_TIMEOUT_MS = 3_000
DEFAULT_IDLE_CLOSE_MS = 45_000  # below the broker's idle_timeout_ms (module docstring)
_MAX_REQUEST_ID = 0xFFFF_FFFF
# Writers wait once the socket's send buffer holds more than this (asyncio's default).
_WRITE_HIGH_WATER_BYTES = 64 * 1024
# Frames corked in one loop turn are written with one writelines() up to this size.
_COALESCE_BYTES = 64 * 1024
# How long close() lets buffered bytes drain before it aborts the connection.
_CLOSE_TIMEOUT_S = 5.0
_RESPONSE = int(Flag.RESPONSE)

#: Handles one request frame a broker sent on a connection (server to client). It runs
#: inside the connection's reader: it must not block (start a task for real work).
RequestHandler = Callable[["BrokerConnection", Frame], None]


def split_addr(addr: str) -> tuple[str, int]:
    """'host:port' -> (host, port); raises ValueError on anything else."""
    host, sep, port = addr.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"bad broker address {addr!r}: expected host:port")
    return host, int(port)


class BrokerConnection:
    """A connection to one broker address. Use `await BrokerConnection.open(addr)`."""

    def __init__(self, addr: str, *, request_timeout_ms: int = DEFAULT_REQUEST_TIMEOUT_MS,
                 max_frame_bytes: int = MAX_FRAME_BYTES,
                 request_handlers: Mapping[int, RequestHandler] | None = None,
                 credentials: Credentials | None = None,
                 tls: ssl.SSLContext | None = None) -> None:
        self.addr = addr
        self.credentials = credentials
        #: The broker's identity (`cluster/name/id`) that signatures name; learned by
        #: IDENTIFY on connecting when there are credentials ("" until then).
        self.target = ""
        self.tls = tls  # TLS to the broker (FERRY_TLS_CA); None: plain TCP
        # The pool passes its own dict: handlers it registers later apply here too.
        self.request_handlers: Mapping[int, RequestHandler] = (
            request_handlers if request_handlers is not None else {})
        self.request_timeout_ms = request_timeout_ms
        self._max_frame_bytes = max_frame_bytes
        self._decoder = FrameDecoder(max_frame_bytes=max_frame_bytes)
        self._transport: asyncio.Transport | None = None
        self._protocol: ConnProtocol | None = None
        self._pending: dict[int, asyncio.Future[Frame]] = {}
        self._ids = itertools.count(1)
        self._closed = True
        self._close_reason = "not connected"
        self._lost: asyncio.Future[None] | None = None
        self._cork = Cork(self._write_out)   # frames corked until the end of the loop turn
        #: When frames were last written (once per corked write, not per request).
        self.last_sent_at = time.monotonic()

    @classmethod
    async def open(cls, addr: str, *, request_timeout_ms: int = DEFAULT_REQUEST_TIMEOUT_MS,
                   connect_timeout_ms: int = DEFAULT_CONNECT_TIMEOUT_MS,
                   request_handlers: Mapping[int, RequestHandler] | None = None,
                   credentials: Credentials | None = None,
                   tls: ssl.SSLContext | None = None) -> BrokerConnection:
        conn = cls(addr, request_timeout_ms=request_timeout_ms,
                   request_handlers=request_handlers, credentials=credentials, tls=tls)
        await conn.connect(connect_timeout_ms)
        return conn

    @property
    def closed(self) -> bool:
        return self._closed

    async def connect(self, connect_timeout_ms: int = DEFAULT_CONNECT_TIMEOUT_MS) -> None:
        host, port = split_addr(self.addr)
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(connect_timeout_ms / 1000):
                transport, protocol = await loop.create_connection(
                    lambda: ConnProtocol(self._data_received, self._shutdown), host, port, ssl=self.tls,
                    server_hostname=host if self.tls is not None else None)
        except (OSError, TimeoutError) as exc:
            raise ConnectionLostError(f"cannot connect to broker {self.addr}: {exc!r}") from exc
        self._transport = transport
        self._protocol = protocol
        self._lost = loop.create_future()
        self._decoder = FrameDecoder(max_frame_bytes=self._max_frame_bytes)
        self._closed = False
        self.last_sent_at = time.monotonic()
        if self.credentials is not None:
            await self._identify(connect_timeout_ms)

    async def _identify(self, timeout_ms: int) -> None:
        """Learn the broker's target (IDENTIFY, unsigned) before the first signed request;
        the connection is closed when that fails (or is cancelled)."""
        target: object = None
        try:
            answer = await self._exchange(
                make_request(RequestCode.IDENTIFY, self._next_id(), {}), timeout_ms)
            target = answer.fields.get("target")
            if type(target) is not str or not target:
                raise ConnectionLostError(f"broker {self.addr} did not say which broker it is "
                                          f"(IDENTIFY answered {answer.fields!r})")
        finally:
            if type(target) is not str or not target:
                self._shutdown("IDENTIFY failed")
        self.target = target

    def _next_id(self) -> int:
        rid = next(self._ids)
        if rid > _MAX_REQUEST_ID:
            self._ids = itertools.count(1)
            rid = next(self._ids)
        return rid

    def _write(self, frame: Frame) -> None:
        if self._closed or self._transport is None:
            raise ConnectionLostError(f"connection to {self.addr} is closed ({self._close_reason})")
        # Encoding errors (an oversized frame) raise here, before anything is written.
        # Corked with the rest of this loop turn's frames, always: writing a request at
        # once when no answer was awaited cost 64 send_and_wait senders (mesh.sync_flush)
        # about 15 % (one write per request instead of one per turn).
        self._cork.add(encode_frame_parts(frame, self._max_frame_bytes))

    def _write_out(self, out: list[bytes | memoryview]) -> None:
        if not out or self._closed or self._transport is None:
            return
        self.last_sent_at = time.monotonic()
        if sum(map(len, out)) <= _COALESCE_BYTES:
            self._transport.writelines(out)
        else:
            # Large bodies go as they are: the selector transport's writelines joins its
            # list first, one more copy of every body (and, past 128 KiB, fresh pages).
            for part in out:
                self._transport.write(part)

    async def drain(self) -> None:
        """Wait while the socket's send buffer is over its high-water mark."""
        protocol, transport = self._protocol, self._transport
        if protocol is None or transport is None:
            return
        if not protocol.paused and transport.get_write_buffer_size() <= _WRITE_HIGH_WATER_BYTES:
            return
        if protocol.drained is None:
            protocol.drained = asyncio.get_running_loop().create_future()
        await asyncio.shield(protocol.drained)

    async def request(self, code: int, fields: Mapping[str, Any], body: bytes = b"",
                      *, timeout_ms: int | None = None) -> Frame:
        """Send a request and return its response frame; error responses raise."""
        frame = make_request(code, self._next_id(), dict(fields), body)
        if self.credentials is not None:  # inline: an unsigned request pays one test
            frame.auth = sign_wire(self.credentials, self.target, code, frame.fields, body)
        return await self._exchange(frame, timeout_ms)

    async def _exchange(self, frame: Frame, timeout_ms: int | None) -> Frame:
        """Write `frame` (signed already, or not to be) and wait for its answer."""
        rid, code = frame.request_id, frame.code
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Frame] = loop.create_future()
        self._write(frame)
        self._pending[rid] = fut
        timeout_s = (timeout_ms if timeout_ms is not None else self.request_timeout_ms) / 1000
        # A plain timer is much cheaper than asyncio.timeout() per request.
        timer = loop.call_later(timeout_s, self._expire, rid, fut, code, timeout_s)
        try:
            if self._protocol is not None and self._protocol.paused:
                await self.drain()
            frame = await fut
        finally:
            timer.cancel()
            self._pending.pop(rid, None)
        if frame.error:
            raise error_for_code(frame.error, frame.message)
        return frame

    def _expire(self, rid: int, fut: asyncio.Future[Frame], code: int, timeout_s: float) -> None:
        if self._pending.get(rid) is fut:
            del self._pending[rid]
        if not fut.done():
            fut.set_exception(RequestTimeoutError(
                f"no response from {self.addr} to request code {code} in {timeout_s:.1f}s"))

    def send_oneway(self, code: int, fields: Mapping[str, Any], body: bytes = b"") -> None:
        """Send a request that gets no response (fire and forget)."""
        self._write(self._signed(
            make_request(code, self._next_id(), dict(fields), body, oneway=True)))

    def _signed(self, frame: Frame) -> Frame:
        """`frame` with its signature when this connection has credentials."""
        if self.credentials is not None:
            frame.auth = sign_wire(self.credentials, self.target, frame.code, frame.fields,
                                   frame.body)
        return frame

    def _data_received(self, data: memoryview) -> None:
        try:
            frames = self._decoder.feed(data)
        except MalformedFrameError as exc:
            reason = f"malformed frame from broker: {exc}"
            log.warning("closing connection to %s: %s", self.addr, reason)
            self._shutdown(reason)
            return
        for frame in frames:
            self._dispatch(frame)

    def _dispatch(self, frame: Frame) -> None:
        if not frame.flags & _RESPONSE:
            self._on_request(frame)
            return
        fut = self._pending.pop(frame.request_id, None)
        if fut is None:
            # The request timed out or was cancelled; its late answer is dropped.
            log.debug("dropping response %d from %s: nobody waits", frame.request_id, self.addr)
            return
        if not fut.done():
            fut.set_result(frame)

    def _on_request(self, frame: Frame) -> None:
        """A request the broker sent us: its handler, or a log line (and an error answer)."""
        handler = self.request_handlers.get(frame.code)
        if handler is None:
            log.warning("ignoring request code %d from %s: no handler", frame.code, self.addr)
            if not frame.is_oneway and not self._closed:
                self._write(error_response(frame, UnknownCodeError(
                    f"this client handles no request code {frame.code}")))
            return
        try:
            handler(self, frame)
        except Exception:   # a handler's bug must not kill the reader (or the connection)
            log.exception("handler of request code %d from %s failed", frame.code, self.addr)

    def respond(self, frame: Frame) -> None:
        """Write a response frame (to a request the broker sent on this connection)."""
        self._write(frame)

    def _shutdown(self, reason: str) -> None:
        if self._lost is not None and not self._lost.done():
            self._lost.set_result(None)
        if self._closed and not self._pending:
            return
        self._closed = True
        self._close_reason = reason
        self._cork.clear()
        pending, self._pending = self._pending, {}
        for fut in pending.values():
            if not fut.done():
                fut.set_exception(ConnectionLostError(f"connection to {self.addr} lost: {reason}"))
        if self._transport is not None:
            self._transport.close()

    def idle_past(self, now: float, limit_s: float) -> bool:
        """Whether nothing was sent (or corked) for `limit_s` and no answer is awaited."""
        return now - self.last_sent_at > limit_s and not self._pending and not self._cork.parts

    def close_idle(self) -> None:
        """Close an idle connection now (nothing is pending, nothing corked)."""
        self._shutdown("idle: closed by the client")

    async def close(self) -> None:
        """Close the connection; pending requests fail with ConnectionLostError."""
        if self._cork.parts:
            self._cork.flush()  # what was sent this loop turn (one-way requests) still goes out
        self._shutdown("closed by the client")
        if self.tls is not None and self._protocol is not None:
            # A TLS transport closes after a close_notify exchange: wait for it, or its
            # socket would outlive the connection.
            try:
                await asyncio.wait_for(asyncio.shield(self._protocol.gone), _CLOSE_TIMEOUT_S)
            except TimeoutError:
                if self._transport is not None:
                    self._transport.abort()
        if self._lost is not None and not self._lost.done():
            try:
                await asyncio.wait_for(asyncio.shield(self._lost), _CLOSE_TIMEOUT_S)
            except TimeoutError:  # the broker does not read what is left to write
                if self._transport is not None:
                    self._transport.abort()


class ConnectionPool:
    """One live connection per broker address, reopened once closed or idle too long."""

    def __init__(self, *, request_timeout_ms: int = DEFAULT_REQUEST_TIMEOUT_MS,
                 connect_timeout_ms: int = DEFAULT_CONNECT_TIMEOUT_MS,
                 request_handlers: Mapping[int, RequestHandler] | None = None,
                 credentials: Credentials | None = None,
                 tls: ssl.SSLContext | None | bool = True,
                 idle_close_ms: int = DEFAULT_IDLE_CLOSE_MS) -> None:
        """`tls`: a client context, None for plain TCP, True (default) for FERRY_TLS_CA's."""
        self.request_timeout_ms = request_timeout_ms
        self._idle_close_s = idle_close_ms / 1000
        self.tls = client_context_from_env() if tls is True else (tls or None)
        #: Every connection of the pool signs its requests with these (None: unsigned).
        self.credentials = credentials
        self.connect_timeout_ms = connect_timeout_ms
        #: Handlers of requests brokers send on this pool's connections, by request code.
        self.request_handlers: dict[int, RequestHandler] = dict(request_handlers or {})
        self._conns: dict[str, BrokerConnection] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    async def get(self, addr: str) -> BrokerConnection:
        conn = self._conns.get(addr)
        if conn is not None and not conn.closed:
            if not conn.idle_past(time.monotonic(), self._idle_close_s):
                return conn
            conn.close_idle()
        lock = self._locks.setdefault(addr, asyncio.Lock())
        async with lock:
            conn = self._conns.get(addr)
            if conn is None or conn.closed:
                conn = await BrokerConnection.open(
                    addr, request_timeout_ms=self.request_timeout_ms,
                    connect_timeout_ms=self.connect_timeout_ms,
                    request_handlers=self.request_handlers, credentials=self.credentials,
                    tls=self.tls)
                self._conns[addr] = conn
            return conn

    async def request(self, addr: str, code: int, fields: Mapping[str, Any], body: bytes = b"",
                      *, timeout_ms: int | None = None) -> Frame:
        conn = await self.get(addr)
        return await conn.request(code, fields, body, timeout_ms=timeout_ms)

    async def close(self) -> None:
        conns, self._conns = list(self._conns.values()), {}
        for conn in conns:
            try:
                await conn.close()
            except FerryError:  # pragma: no cover - close never raises on purpose
                pass
