"""The producer's memory bound: bytes queued but not yet acknowledged (Kafka's buffer.memory).

Every message takes its encoded size from the budget when it is queued and
gives it back when its future resolves (acknowledged or failed for good). A
message retried stays counted. When the budget is spent, `send()` waits for
space in arrival order, up to `max_block_ms`, then fails with a retriable
`BusyError`. A message larger than the whole budget is let in alone (when
nothing else is queued), so a small budget never makes a legal message
unsendable.

The producer's hot path checks `used_bytes` and `waiters` inline and only
calls `take()` when it has to wait.
"""
from __future__ import annotations

import asyncio
from collections import deque

from ferry.errors import BusyError


class ByteBudget:
    """A FIFO byte semaphore for one event loop."""

    __slots__ = ("limit_bytes", "used_bytes", "waiters")

    def __init__(self, limit_bytes: int) -> None:
        if limit_bytes <= 0:
            raise ValueError("limit_bytes must be > 0")
        self.limit_bytes = limit_bytes
        self.used_bytes = 0
        # senders waiting for space, in arrival order (a newcomer queues behind them)
        self.waiters: deque[tuple[int, asyncio.Future[None]]] = deque()

    def fits(self, size: int) -> bool:
        return self.used_bytes + size <= self.limit_bytes or self.used_bytes == 0

    def try_take(self, size: int) -> bool:
        """Take `size` bytes now if they fit and nobody waits before us."""
        if self.waiters or not self.fits(size):
            return False
        self.used_bytes += size
        return True

    async def take(self, size: int, timeout_ms: int) -> None:
        """Take `size` bytes, waiting up to `timeout_ms` for space (then BusyError)."""
        if self.try_take(size):
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (size, fut)
        self.waiters.append(entry)
        try:
            async with asyncio.timeout(timeout_ms / 1000):
                await fut
        except BaseException as exc:
            if fut.done() and not fut.cancelled():
                self.release(size)   # granted just as we gave up: pass it on
            else:
                fut.cancel()
                try:
                    self.waiters.remove(entry)
                except ValueError:
                    pass
                self._grant()        # a smaller sender behind us may fit now
            if isinstance(exc, TimeoutError):
                raise BusyError(
                    f"producer buffer full: {self.used_bytes} of {self.limit_bytes} bytes wait "
                    f"for acknowledgements, and {size} more found no room in {timeout_ms} ms "
                    "(max_block_ms); the brokers are slower than the sender") from None
            raise

    def release(self, size: int) -> None:
        """Give back `size` bytes (their messages are acknowledged or failed)."""
        self.used_bytes -= size
        if self.waiters:
            self._grant()

    def _grant(self) -> None:
        waiters = self.waiters
        while waiters:
            size, fut = waiters[0]
            if fut.done():
                waiters.popleft()
                continue
            if not self.fits(size):
                return
            waiters.popleft()
            self.used_bytes += size
            fut.set_result(None)
