"""The asyncio protocol under a broker connection: received bytes go straight to the
connection's decoder, and the transport's write flow control is tracked for `drain`.

A `BufferedProtocol`: the transport reads into one buffer the protocol keeps
(`recv_into`), instead of allocating a fresh `bytes` of up to 256 KiB per read,
and hands the decoder a view of what arrived. The decoder copies everything it
keeps (bodies, the tail of an incomplete frame) before the buffer is reused.

Split from `connection.py`, which owns the requests; this owns only the socket events.
"""
from __future__ import annotations

import asyncio
from collections.abc import Callable

#: The receive buffer: what one read may bring (asyncio's own `max_size` for a read).
READ_BUFFER_BYTES = 256 * 1024


class ConnProtocol(asyncio.BufferedProtocol):
    """Feeds received bytes to the connection and tracks write flow control."""

    def __init__(self, on_data: Callable[[memoryview], None],
                 on_lost: Callable[[str], None]) -> None:
        self.on_data = on_data
        self._buffer = memoryview(bytearray(READ_BUFFER_BYTES))
        self.on_lost = on_lost
        self.paused = False
        self.drained: asyncio.Future[None] | None = None
        #: Done once the transport is closed for good (a TLS one after its close_notify).
        self.gone: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._buffer

    def buffer_updated(self, nbytes: int) -> None:
        with self._buffer[:nbytes] as data:
            self.on_data(data)

    def eof_received(self) -> bool:
        return False  # close the transport; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.on_lost(repr(exc) if exc is not None else "closed by the broker")
        self.resume_writing()
        if not self.gone.done():
            self.gone.set_result(None)

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        waiter, self.drained = self.drained, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
