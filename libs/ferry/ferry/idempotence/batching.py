"""Coalescing the calls made in one event-loop turn into one batch: one Redis round trip.

`consumer.run(..., concurrency=N)` starts up to N handlers in the same turn of
the event loop; each takes a claim first and confirms it last. Sent one by one
that is 2 round trips per message, and the Python client's per-call cost
(about 0.1 ms) caps a consumer at a few thousand messages a second. A
`Coalescer` queues the items submitted during one turn and runs them as one
call at the end of it (`loop.call_soon`), so N claims cost one round trip;
each caller still gets its own result (or the batch's exception).
"""
from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")

#: Items per batch at most: a Lua script blocks Redis while it runs, so keep each short.
MAX_BATCH = 256


class Coalescer(Generic[T, R]):
    """`await coalescer.submit(item)` -> its result, computed by `run(items)` for a batch."""

    def __init__(self, run: Callable[[list[T]], Awaitable[Sequence[R]]],
                 max_batch: int = MAX_BATCH) -> None:
        if not 1 <= max_batch <= MAX_BATCH:
            raise ValueError(f"max_batch must be in 1..{MAX_BATCH}")
        self._run = run
        self.max_batch = max_batch
        self._pending: list[tuple[T, asyncio.Future[R]]] = []
        self._scheduled = False
        self._flushing: set[asyncio.Task[None]] = set()   # strong refs until done

    async def submit(self, item: T) -> R:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[R] = loop.create_future()
        self._pending.append((item, future))
        if not self._scheduled:
            # After the handlers already scheduled in this turn have submitted theirs.
            self._scheduled = True
            loop.call_soon(self._flush_soon)
        return await future

    def _flush_soon(self) -> None:
        self._scheduled = False
        pending, self._pending = self._pending, []
        loop = asyncio.get_running_loop()
        for start in range(0, len(pending), self.max_batch):
            task = loop.create_task(self._flush(pending[start:start + self.max_batch]))
            self._flushing.add(task)
            task.add_done_callback(self._flushing.discard)

    async def _flush(self, batch: list[tuple[T, asyncio.Future[R]]]) -> None:
        try:
            results = await self._run([item for item, _ in batch])
        except Exception as exc:   # e.g. Redis unreachable: every caller decides for itself
            for _, future in batch:
                if not future.done():
                    future.set_exception(exc)
            return
        except BaseException:
            for _, future in batch:
                future.cancel()
            raise
        for (_, future), result in zip(batch, results, strict=True):
            if not future.done():   # its caller was cancelled meanwhile
                future.set_result(result)
