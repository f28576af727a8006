"""Put requests waiting for the in-sync slaves' acknowledgement (sync replication).

One heap of (end offset, future) for all waiters: when the offset every in-sync
slave acknowledged moves, one pass pops every waiter at or below it, so a burst
of puts costs one future and one timer handle each, never a task. A waiter that
timed out stays in the heap (done) until an ACK or `fail_all` passes it; its
timeout is reported to `on_timeout(end_offset)` (the server then drops the
slaves that did not make it from the in-sync set).
"""
from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Callable

from ferry.errors import SlaveNotAvailableError


class AckWaiters:
    """Futures resolved when the best acknowledged offset reaches their end offset."""

    def __init__(self, on_timeout: Callable[[int], None] | None = None) -> None:
        self._heap: list[tuple[int, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()
        self._on_timeout = on_timeout

    def __len__(self) -> int:
        return len(self._heap)

    async def wait(self, end_offset: int, timeout_ms: int) -> None:
        """Until `acked` reaches `end_offset`; SlaveNotAvailableError after `timeout_ms`."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        heapq.heappush(self._heap, (end_offset, next(self._seq), fut))
        timer = loop.call_later(timeout_ms / 1000.0, self._expire, fut, end_offset, timeout_ms)
        try:
            await fut
        finally:
            timer.cancel()

    def acked(self, offset: int) -> None:
        """Every in-sync slave acknowledged everything below `offset`: release those waiters."""
        heap = self._heap
        while heap and heap[0][0] <= offset:
            fut = heapq.heappop(heap)[2]
            if not fut.done():
                fut.set_result(None)

    def fail_all(self, reason: str) -> None:
        """Nobody is left to acknowledge (server stopped, set too small): fail every waiter."""
        heap, self._heap = self._heap, []
        for _, _, fut in heap:
            if not fut.done():
                fut.set_exception(SlaveNotAvailableError(reason))

    def _expire(self, fut: asyncio.Future[None], end_offset: int, timeout_ms: int) -> None:
        if fut.done():
            return
        fut.set_exception(SlaveNotAvailableError(
            f"the in-sync slaves did not acknowledge offset {end_offset} within {timeout_ms} ms"))
        if self._on_timeout is not None:
            self._on_timeout(end_offset)
