"""Background tasks: cancelling one, one per key, and a step repeated for good.

`cancel_and_wait` ends a task (the stop of every watcher and loop);
`KeyedTasks` keeps one task per key of the keys wanted now (one per queue of
a route that changes, `ferry.client.reading`); `repeat` runs one step again
and again, logging a failure instead of ending (a loop that must outlive any
one failure). A leaf: it imports nothing of Ferry.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Coroutine, Hashable
from typing import Any, Generic, TypeVar

K = TypeVar("K", bound=Hashable)


async def cancel_and_wait(task: asyncio.Task[Any] | None) -> None:
    """Cancel `task` (if any) and wait for its end (its cancellation is not re-raised)."""
    if task is not None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def repeat(step: Callable[[], Awaitable[None]], log: logging.Logger, what: str, *,
                 pause_s: float = 0.0, error_pause_s: float = 0.0) -> None:
    """Run `step` until cancelled, `pause_s` apart; a failure is logged (as `what`
    failed) and followed by `error_pause_s` more, never raised."""
    while True:
        try:
            await step()
        except asyncio.CancelledError:
            raise
        except Exception:  # the loop must outlive any one failure
            log.exception("%s failed; going on", what)
            await asyncio.sleep(error_pause_s)
        if pause_s:
            await asyncio.sleep(pause_s)


class KeyedTasks(Generic[K]):
    """One background task per key, kept in line with the keys wanted now.

    A key no longer wanted, or whose task ended, is cancelled (and started again
    next time if still wanted).
    """

    def __init__(self) -> None:
        self._tasks: dict[K, asyncio.Task[None]] = {}

    def __len__(self) -> int:
        return len(self._tasks)

    async def reconcile(self, want: set[K], start: Callable[[K], Coroutine[Any, Any, None]],
                        name: Callable[[K], str]) -> list[K]:
        """Cancel the tasks not in `want` (or finished), start the missing ones; the started keys."""
        for key in list(self._tasks):
            if key not in want or self._tasks[key].done():
                await self.cancel(key)
        started = [key for key in want if key not in self._tasks]
        for key in started:
            self._tasks[key] = asyncio.create_task(start(key), name=name(key))
        return started

    async def cancel(self, key: K) -> None:
        task = self._tasks.pop(key)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task

    async def stop(self) -> None:
        for key in list(self._tasks):
            await self.cancel(key)
