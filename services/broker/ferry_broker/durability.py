"""Waiting for sync-flush durability from asyncio, once per flush group.

The store resolves every append of one group commit through the same
`concurrent.futures.Future`. Wrapping it per request would cost one
thread-safe loop wake-up per waiter on every fsync (the bench showed that
halves throughput with 256 senders), so the broker wraps each distinct group
future once, with one backstop timer per group, and hands each request a
shield of it so that one cancelled request never cancels the group.
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
            shared = asyncio.wrap_future(group)
            # Holding `group` in the dict keeps its id from being reused while listed.
            self._groups[key] = (group, shared)
            timer = asyncio.get_running_loop().call_later(self._backstop_s, _expire, shared)

            def forget(_done: asyncio.Future[None]) -> None:
                timer.cancel()
                self._groups.pop(key, None)

            shared.add_done_callback(forget)
        else:
            shared = entry[1]
        return asyncio.shield(shared)

    def __len__(self) -> int:
        return len(self._groups)


def _expire(shared: asyncio.Future[None]) -> None:
    if not shared.done():
        shared.set_exception(FlushTimeoutError("not flushed within the sync-flush timeout"))
