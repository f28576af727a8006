"""The slave's receiving end of a replication link, without stream copies.

`LinkProtocol` reads the frames of `protocol.py` straight into one buffer (an
asyncio BufferedProtocol) and hands out views of their payloads, with the
same checks as `protocol.read_frame`.
"""
from __future__ import annotations

import asyncio
from typing import cast

from .protocol import (
    CHUNK_BYTES,
    DATA_HEAD,
    LENGTH,
    MAX_FRAME_BYTES,
    TYPE,
    FrameType,
    ReplicationProtocolError,
)

#: Initial receive buffer of a LinkProtocol: two whole DATA frames (it grows for a larger one).
READ_BUFFER_BYTES = 2 * (CHUNK_BYTES + LENGTH.size + TYPE.size + DATA_HEAD.size)


class LinkProtocol(asyncio.BufferedProtocol):
    """One link's connection as a protocol that reads frames straight into one buffer.

    asyncio's StreamReader copies every byte twice more (a bytes object per socket
    read, appended to its buffer, then copied out by readexactly): for a slave
    that is most of what receiving a DATA frame costs. Here the kernel writes into
    the buffer and `read_frame` hands out a view of the payload, valid until the
    next `read_frame` (the buffer is compacted or replaced only there). The same
    checks as `read_frame` apply, in the same order.
    """

    def __init__(self) -> None:
        self._buf = bytearray(READ_BUFFER_BYTES)
        self._mv = memoryview(self._buf)
        self._start = 0  # the first byte not yet handed out
        self._end = 0  # the end of what was received
        self._waiter: asyncio.Future[None] | None = None  # read_frame waiting for bytes
        self._drained: asyncio.Future[None] | None = None  # drain waiting for the transport
        self._lost: BaseException | None = None  # why the connection ended
        self._reading_paused = False
        self._writing_paused = False
        self.transport: asyncio.Transport | None = None

    # -- protocol callbacks (the event loop calls these) -----------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # (a uvloop transport is no asyncio.Transport subclass, but has its methods)
        self.transport = cast(asyncio.Transport, transport)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._mv[self._end:]

    def buffer_updated(self, nbytes: int) -> None:
        self._end += nbytes
        if self._end == len(self._buf) and self.transport is not None:
            self.transport.pause_reading()  # full: read_frame makes room, then resumes
            self._reading_paused = True
        self._wake()

    def eof_received(self) -> bool:
        return False  # close the transport: a link never half-closes

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = exc if exc is not None else EOFError()
        self._wake()
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)

    def pause_writing(self) -> None:
        self._writing_paused = True

    def resume_writing(self) -> None:
        self._writing_paused = False
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)

    # -- what the link calls ---------------------------------------------------------------

    def write(self, parts: list[bytes | memoryview]) -> None:
        assert self.transport is not None
        self.transport.writelines(parts)

    async def drain(self) -> None:
        """Wait while the transport's write buffer is over its high-water mark."""
        while self._writing_paused and self._lost is None:
            self._drained = asyncio.get_running_loop().create_future()
            await self._drained
        if self._lost is not None and not isinstance(self._lost, EOFError):
            raise ConnectionResetError(f"replication link lost: {self._lost}")

    async def read_frame(self) -> tuple[FrameType, memoryview]:
        """The next frame's (type, payload view); the view is valid until the next call.

        ReplicationProtocolError for an oversized or empty length or an unknown type;
        asyncio.IncompleteReadError when the peer closes mid-frame (or before one).
        """
        await self._need(LENGTH.size)
        (size,) = LENGTH.unpack_from(self._buf, self._start)
        if not TYPE.size <= size <= MAX_FRAME_BYTES:
            raise ReplicationProtocolError(f"frame length {size} is outside 1..{MAX_FRAME_BYTES}")
        await self._need(LENGTH.size + TYPE.size)
        raw_type = self._buf[self._start + LENGTH.size]
        try:
            ftype = FrameType(raw_type)
        except ValueError:
            raise ReplicationProtocolError(f"unknown frame type {raw_type}") from None
        await self._need(LENGTH.size + size)
        at = self._start + LENGTH.size + TYPE.size
        self._start += LENGTH.size + size
        return ftype, self._mv[at:self._start]

    async def _need(self, count: int) -> None:
        """Wait until `count` bytes from `_start` were received (making room first)."""
        if self._start + count > len(self._buf):
            self._make_room(count)
        while self._end - self._start < count:
            if self._lost is not None:
                if isinstance(self._lost, EOFError):
                    raise asyncio.IncompleteReadError(bytes(self._mv[self._start:self._end]),
                                                      count)
                raise ConnectionResetError(f"replication link lost: {self._lost}")
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None

    def _make_room(self, count: int) -> None:
        """Move the bytes not handed out yet to the front of a buffer that holds `count`.

        Called only from read_frame, after the previous payload view was released
        by the caller; a buffer grown for one large frame is kept (at most one frame).
        """
        pending = bytes(self._mv[self._start:self._end])
        if count > len(self._buf):
            self._buf = bytearray(count + READ_BUFFER_BYTES // 2)
            self._mv = memoryview(self._buf)
        self._buf[:len(pending)] = pending
        self._start, self._end = 0, len(pending)
        if self._reading_paused and self.transport is not None:
            self._reading_paused = False
            self.transport.resume_reading()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)
