"""Waiting for sync-flush durability from asyncio, once per flush group.

The store resolves every append of one group commit through the same
`concurrent.futures.Future`. Wrapping it per request would cost one
thread-safe loop wake-up per waiter on every fsync (the bench showed that
halves throughput with 256 senders), so the broker mirrors each distinct group
future once into an asyncio future, with one backstop timer per group, and
hands each request a shield of it so that one cancelled request never cancels
the group.

The mirror is set by a done-callback that hops to the loop and sets the
asyncio future only if it is still pending: the backstop may have failed it
already, and the group's late completion must then be dropped quietly
(`asyncio.wrap_future` asserts in that case).
"""
from __future__ import annotations

import asyncio
import concurrent.futures

from ferry.errors import FlushTimeoutError


class DurabilityWaiter:
    """Shares one asyncio future per store flush group."""

    def __init__(self, timeout_ms: int) -> None:
        # The store fails a group itself after its timeout; this backstop covers a
        # flush thread stuck in fdatasync, which the store only notices later.
        self._backstop_s = timeout_ms / 1000.0 + 1.0
        self._groups: dict[int, tuple[concurrent.futures.Future[None], asyncio.Future[None]]] = {}

    def wait(self, group: concurrent.futures.Future[None]) -> asyncio.Future[None]:
        """An awaitable that completes when `group` does (or fails with FlushTimeoutError)."""
        key = id(group)
        entry = self._groups.get(key)
        if entry is None:
            loop = asyncio.get_running_loop()
            shared: asyncio.Future[None] = loop.create_future()
            # Holding `group` in the dict keeps its id from being reused while listed.
            self._groups[key] = (group, shared)
            timer = loop.call_later(self._backstop_s, _expire, shared)

            def forget(_done: asyncio.Future[None]) -> None:
                timer.cancel()
                self._groups.pop(key, None)

            shared.add_done_callback(forget)
            if group.done():
                _copy(group, shared)
            else:
                group.add_done_callback(lambda done: _copy_threadsafe(loop, done, shared))
        else:
            shared = entry[1]
        return asyncio.shield(shared)

    def __len__(self) -> int:
        return len(self._groups)


def _copy_threadsafe(loop: asyncio.AbstractEventLoop, group: concurrent.futures.Future[None],
                     shared: asyncio.Future[None]) -> None:
    """Store's thread: hand the group's outcome to the loop."""
    try:
        loop.call_soon_threadsafe(_copy, group, shared)
    except RuntimeError:
        pass  # the loop is closed: nobody waits any more


def _copy(group: concurrent.futures.Future[None], shared: asyncio.Future[None]) -> None:
    """Loop: set `shared` from `group`, unless the backstop (or a cancel) came first."""
    if shared.done():
        return
    if group.cancelled():
        shared.cancel()
        return
    exc = group.exception()
    if exc is not None:
        shared.set_exception(exc)
    else:
        shared.set_result(None)


def _expire(shared: asyncio.Future[None]) -> None:
    if not shared.done():
        shared.set_exception(FlushTimeoutError("not flushed within the sync-flush timeout"))
