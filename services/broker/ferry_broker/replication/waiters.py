"""Put requests waiting for a slave's acknowledgement (sync replication).

One heap of (end offset, future) for all waiters: an ACK pops every waiter at or
below its offset in one pass, so a burst of puts costs one future and one timer
handle each, never a task. A waiter that timed out stays in the heap (done)
until an ACK or `fail_all` passes it.
"""
from __future__ import annotations

import asyncio
import heapq
import itertools

from ferry.errors import SlaveNotAvailableError


class AckWaiters:
    """Futures resolved when the best acknowledged offset reaches their end offset."""

    def __init__(self) -> None:
        self._heap: list[tuple[int, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()

    def __len__(self) -> int:
        return len(self._heap)

    async def wait(self, end_offset: int, timeout_ms: int) -> None:
        """Until `acked` reaches `end_offset`; SlaveNotAvailableError after `timeout_ms`."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        heapq.heappush(self._heap, (end_offset, next(self._seq), fut))
        timer = loop.call_later(timeout_ms / 1000.0, _expire, fut, end_offset, timeout_ms)
        try:
            await fut
        finally:
            timer.cancel()

    def acked(self, offset: int) -> None:
        """A slave acknowledged everything below `offset`: release those waiters."""
        heap = self._heap
        while heap and heap[0][0] <= offset:
            fut = heapq.heappop(heap)[2]
            if not fut.done():
                fut.set_result(None)

    def fail_all(self, reason: str) -> None:
        """No slave is left to acknowledge: fail every waiter now."""
        heap, self._heap = self._heap, []
        for _, _, fut in heap:
            if not fut.done():
                fut.set_exception(SlaveNotAvailableError(reason))


def _expire(fut: asyncio.Future[None], end_offset: int, timeout_ms: int) -> None:
    if not fut.done():
        fut.set_exception(SlaveNotAvailableError(
            f"no slave acknowledged offset {end_offset} within {timeout_ms} ms"))
