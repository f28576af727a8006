"""One multiplexed TCP connection to a broker, and a pool of them by address.

Many requests share one connection: each carries a request id, and ONE reader
task matches every response to the future waiting for it. A request that gets
no answer in time fails alone with RequestTimeoutError; when the connection
drops, exactly the requests still pending fail with ConnectionLostError. A
response with a non-zero error code raises the matching `ferry.errors` class.
"""
from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Mapping
from typing import Any

from ferry.errors import ConnectionLostError, FerryError, RequestTimeoutError, error_for_code
from ferry.wire import MAX_FRAME_BYTES, Frame, FrameDecoder, MalformedFrameError, encode_frame_parts
from ferry.wire import request as make_request

log = logging.getLogger(__name__)

DEFAULT_REQUEST_TIMEOUT_MS = 10_000
DEFAULT_CONNECT_TIMEOUT_MS = 3_000
_READ_CHUNK_BYTES = 256 * 1024
_MAX_REQUEST_ID = 0xFFFF_FFFF


def split_addr(addr: str) -> tuple[str, int]:
    """'host:port' -> (host, port); raises ValueError on anything else."""
    host, sep, port = addr.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"bad broker address {addr!r}: expected host:port")
    return host, int(port)


class BrokerConnection:
    """A connection to one broker address. Use `await BrokerConnection.open(addr)`."""

    def __init__(self, addr: str, *, request_timeout_ms: int = DEFAULT_REQUEST_TIMEOUT_MS,
                 max_frame_bytes: int = MAX_FRAME_BYTES) -> None:
        self.addr = addr
        self.request_timeout_ms = request_timeout_ms
        self._max_frame_bytes = max_frame_bytes
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._reader_task: asyncio.Task[None] | None = None
        self._pending: dict[int, asyncio.Future[Frame]] = {}
        self._ids = itertools.count(1)
        self._closed = True
        self._close_reason = "not connected"

    @classmethod
    async def open(cls, addr: str, *, request_timeout_ms: int = DEFAULT_REQUEST_TIMEOUT_MS,
                   connect_timeout_ms: int = DEFAULT_CONNECT_TIMEOUT_MS) -> BrokerConnection:
        conn = cls(addr, request_timeout_ms=request_timeout_ms)
        await conn.connect(connect_timeout_ms)
        return conn

    @property
    def closed(self) -> bool:
        return self._closed

    async def connect(self, connect_timeout_ms: int = DEFAULT_CONNECT_TIMEOUT_MS) -> None:
        host, port = split_addr(self.addr)
        try:
            async with asyncio.timeout(connect_timeout_ms / 1000):
                self._reader, self._writer = await asyncio.open_connection(host, port)
        except (OSError, TimeoutError) as exc:
            raise ConnectionLostError(f"cannot connect to broker {self.addr}: {exc!r}") from exc
        self._closed = False
        self._reader_task = asyncio.create_task(self._read_loop(), name=f"ferry-read-{self.addr}")

    def _next_id(self) -> int:
        rid = next(self._ids)
        if rid > _MAX_REQUEST_ID:
            self._ids = itertools.count(1)
            rid = next(self._ids)
        return rid

    def _write(self, frame: Frame) -> None:
        if self._closed or self._writer is None:
            raise ConnectionLostError(f"connection to {self.addr} is closed ({self._close_reason})")
        # Encoding errors (an oversized frame) raise here, before anything is written.
        self._writer.writelines(encode_frame_parts(frame, self._max_frame_bytes))

    async def request(self, code: int, fields: Mapping[str, Any], body: bytes = b"",
                      *, timeout_ms: int | None = None) -> Frame:
        """Send a request and return its response frame; error responses raise."""
        rid = self._next_id()
        fut: asyncio.Future[Frame] = asyncio.get_running_loop().create_future()
        self._write(make_request(code, rid, dict(fields), body))
        self._pending[rid] = fut
        timeout_s = (timeout_ms if timeout_ms is not None else self.request_timeout_ms) / 1000
        try:
            assert self._writer is not None
            await self._writer.drain()
            async with asyncio.timeout(timeout_s):
                frame = await fut
        except TimeoutError:
            raise RequestTimeoutError(
                f"no response from {self.addr} to request code {code} in {timeout_s:.1f}s") from None
        except (ConnectionError, OSError) as exc:
            raise ConnectionLostError(f"connection to {self.addr} lost: {exc!r}") from exc
        finally:
            self._pending.pop(rid, None)
        if frame.error:
            raise error_for_code(frame.error, frame.message)
        return frame

    def send_oneway(self, code: int, fields: Mapping[str, Any], body: bytes = b"") -> None:
        """Send a request that gets no response (fire and forget)."""
        self._write(make_request(code, self._next_id(), dict(fields), body, oneway=True))

    async def _read_loop(self) -> None:
        assert self._reader is not None
        decoder = FrameDecoder(max_frame_bytes=self._max_frame_bytes)
        reason = "closed by the broker"
        try:
            while True:
                data = await self._reader.read(_READ_CHUNK_BYTES)
                if not data:
                    break
                for frame in decoder.feed(data):
                    self._dispatch(frame)
        except MalformedFrameError as exc:
            reason = f"malformed frame from broker: {exc}"
            log.warning("closing connection to %s: %s", self.addr, reason)
        except (ConnectionError, OSError) as exc:
            reason = repr(exc)
        except asyncio.CancelledError:
            reason = "closed by the client"
        finally:
            self._shutdown(reason)

    def _dispatch(self, frame: Frame) -> None:
        fut = self._pending.pop(frame.request_id, None)
        if fut is None:
            # The request timed out or was cancelled; its late answer is dropped.
            log.debug("dropping response %d from %s: nobody waits", frame.request_id, self.addr)
            return
        if not fut.done():
            fut.set_result(frame)

    def _shutdown(self, reason: str) -> None:
        if self._closed and not self._pending:
            return
        self._closed = True
        self._close_reason = reason
        pending, self._pending = self._pending, {}
        for fut in pending.values():
            if not fut.done():
                fut.set_exception(ConnectionLostError(f"connection to {self.addr} lost: {reason}"))
        if self._writer is not None:
            self._writer.close()

    async def close(self) -> None:
        """Close the connection; pending requests fail with ConnectionLostError."""
        task = self._reader_task
        self._shutdown("closed by the client")
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._writer is not None:
            with contextlib.suppress(ConnectionError, OSError):
                await self._writer.wait_closed()


class ConnectionPool:
    """One live connection per broker address, reconnecting when the old one closed."""

    def __init__(self, *, request_timeout_ms: int = DEFAULT_REQUEST_TIMEOUT_MS,
                 connect_timeout_ms: int = DEFAULT_CONNECT_TIMEOUT_MS) -> None:
        self.request_timeout_ms = request_timeout_ms
        self.connect_timeout_ms = connect_timeout_ms
        self._conns: dict[str, BrokerConnection] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    async def get(self, addr: str) -> BrokerConnection:
        conn = self._conns.get(addr)
        if conn is not None and not conn.closed:
            return conn
        lock = self._locks.setdefault(addr, asyncio.Lock())
        async with lock:
            conn = self._conns.get(addr)
            if conn is None or conn.closed:
                conn = await BrokerConnection.open(
                    addr, request_timeout_ms=self.request_timeout_ms,
                    connect_timeout_ms=self.connect_timeout_ms)
                self._conns[addr] = conn
            return conn

    def get_nowait(self, addr: str) -> BrokerConnection | None:
        """The open connection to `addr`, if there is one."""
        conn = self._conns.get(addr)
        return conn if conn is not None and not conn.closed else None

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
