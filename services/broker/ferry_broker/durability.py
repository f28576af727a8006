"""Waiting for sync-flush durability from asyncio, once per flush group.

The store resolves every append of one group commit through the same
`concurrent.futures.Future`. Wrapping it per request would cost one
thread-safe loop wake-up per waiter on every fsync (the bench showed that
halves throughput with 256 senders), so the broker registers one done-callback
per distinct group, with one backstop timer, and keeps the group's waiting
requests in a list: each request gets a plain loop future of its own, and the
group's outcome, once it hops to the loop, is set on each of them in one pass.

A future per request (rather than one shared future and an `asyncio.shield` of
it per request, as before) is what keeps a cancelled request from cancelling
the group: cancelling a request cancels its own future only, which the pass
then skips. It also costs a waiter one future and one wake-up of its task,
where a shield cost two futures, two callbacks and two loop callbacks.

The group's outcome is dropped quietly when the backstop has failed its
waiters already (the flush thread was stuck and finished late).
"""
from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable

from ferry.errors import FlushTimeoutError


class _Waiters:
    """The requests waiting for one flush group: a future each, and the backstop timer."""

    __slots__ = ("group", "loop", "futures", "timer")

    def __init__(self, group: concurrent.futures.Future[None], loop: asyncio.AbstractEventLoop,
                 first: asyncio.Future[None]) -> None:
        self.group = group  # held while listed: its id (the key) cannot be reused meanwhile
        self.loop = loop
        self.futures = [first]
        self.timer: asyncio.TimerHandle | None = None


class DurabilityWaiter:
    """Hands each request a future of its own, completed with its store flush group."""

    def __init__(self, timeout_ms: int) -> None:
        # The store fails a group itself after its timeout; this backstop covers a
        # flush thread stuck in fdatasync, which the store only notices later.
        self._backstop_s = timeout_ms / 1000.0 + 1.0
        self._groups: dict[int, _Waiters] = {}

    def wait(self, group: concurrent.futures.Future[None],
             start: Callable[[], None] | None = None) -> asyncio.Future[None]:
        """An awaitable that completes when `group` does (or fails with FlushTimeoutError).

        Cancelling it cancels this request's wait only, never the group's.
        `start`: the store's `start_flush`, for a group asked for with
        `wait_durable(start=False)`: called once per group, by `call_soon`, i.e.
        after the requests that are ready in this loop turn have been put too,
        so that they all share the group's fdatasync."""
        key = id(group)
        waiters = self._groups.get(key)
        if waiters is not None:  # the common case: a later request of a listed group
            fut: asyncio.Future[None] = waiters.loop.create_future()
            waiters.futures.append(fut)
            return fut
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        if group.done():
            _settle(group, (fut,))
            return fut
        waiters = self._groups[key] = _Waiters(group, loop, fut)
        waiters.timer = loop.call_later(self._backstop_s, self._expire, key)
        if start is not None:
            loop.call_soon(start)
        finish = self._finish
        group.add_done_callback(lambda done: _hop(loop, finish, key, done))
        return fut

    def __len__(self) -> int:
        return len(self._groups)

    def _finish(self, key: int, group: concurrent.futures.Future[None]) -> None:
        """Loop: the group is done; complete its waiters (unless the backstop came first)."""
        waiters = self._groups.get(key)
        if waiters is None or waiters.group is not group:
            return
        del self._groups[key]
        if waiters.timer is not None:
            waiters.timer.cancel()
        _settle(group, waiters.futures)

    def _expire(self, key: int) -> None:
        """Loop: the backstop: fail the group's waiters, forget the group."""
        waiters = self._groups.pop(key, None)
        if waiters is None:
            return
        exc = FlushTimeoutError("not flushed within the sync-flush timeout")
        for fut in waiters.futures:
            if not fut.done():
                fut.set_exception(exc)


def _hop(loop: asyncio.AbstractEventLoop,
         finish: Callable[[int, concurrent.futures.Future[None]], None],
         key: int, group: concurrent.futures.Future[None]) -> None:
    """Store's thread: hand the group's outcome to the loop."""
    try:
        loop.call_soon_threadsafe(finish, key, group)
    except RuntimeError:
        pass  # the loop is closed: nobody waits any more


def _settle(group: concurrent.futures.Future[None],
            futures: list[asyncio.Future[None]] | tuple[asyncio.Future[None], ...]) -> None:
    """Loop: set each still-pending future from the done `group` (a cancelled request's
    future is done already and skipped)."""
    if group.cancelled():
        for fut in futures:
            fut.cancel()
        return
    exc = group.exception()
    for fut in futures:
        if fut.done():
            continue
        if exc is None:
            fut.set_result(None)
        else:
            fut.set_exception(exc)
