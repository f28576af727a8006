"""Held PULL requests, woken when a message for their queue is stored.

A PULL that finds nothing is parked on its (topic, queue_id) until the SEND
path stores a message there (`notify`, called right after `put_batch`) or its
`max_wait_ms` runs out. Waking is by future, not by polling timers, so a
parked consumer sees a new message within one event-loop turn of the write.

Limits: `max_wait_ms` is capped by the caller (15 s by default); at most
`max_per_conn` held pulls per connection and `max_total` overall, beyond which
the pull fails with BusyError (retriable) instead of piling up.
"""
from __future__ import annotations

import asyncio
from collections.abc import Callable

from ferry.errors import BusyError

QueueKey = tuple[str, int]


class LongPollManager:
    """Parks pulls per queue and wakes them on a put."""

    def __init__(self, max_per_conn: int, max_total: int) -> None:
        self._max_per_conn = max_per_conn
        self._max_total = max_total
        self._waiters: dict[QueueKey, set[asyncio.Future[bool]]] = {}
        self._held_by_conn: dict[int, int] = {}
        self._held_total = 0
        self._closing = False
        # Told the name of the limit each time one refuses a pull (/v1/stats counts them).
        self.on_refuse: Callable[[str], None] = _ignore

    @property
    def held(self) -> int:
        """How many pulls are parked right now."""
        return self._held_total

    @property
    def closing(self) -> bool:
        return self._closing

    def slot(self, conn_id: int) -> _Slot:
        """Count one held pull against the limits for as long as the block runs
        (`with` or `async with`; BusyError on entry when a limit is reached).

        A plain object rather than an asynccontextmanager: every parked pull takes
        one, thousands a second, and a generator-based manager costs several times
        as much on the broker's loop, on the way to every woken pull's answer."""
        return _Slot(self, conn_id)

    def _take_slot(self, conn_id: int) -> None:
        held = self._held_by_conn.get(conn_id, 0)
        if held >= self._max_per_conn:
            self.on_refuse("held_pulls_over_per_conn")
            raise BusyError(f"too many held pulls on this connection (limit {self._max_per_conn})")
        if self._held_total >= self._max_total:
            self.on_refuse("held_pulls_over_total")
            raise BusyError(f"too many held pulls on this broker (limit {self._max_total})")
        self._held_by_conn[conn_id] = held + 1
        self._held_total += 1

    def _give_slot(self, conn_id: int) -> None:
        self._held_total -= 1
        left = self._held_by_conn[conn_id] - 1
        if left:
            self._held_by_conn[conn_id] = left
        else:
            del self._held_by_conn[conn_id]

    async def wait(self, topic: str, queue_id: int, timeout_s: float) -> bool:
        """Park until a put on this queue (True) or the timeout / shutdown (False)."""
        if self._closing or timeout_s <= 0:
            return False
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[bool] = loop.create_future()
        key = (topic, queue_id)
        waiters = self._waiters.setdefault(key, set())
        waiters.add(fut)
        timer = loop.call_later(timeout_s, _resolve, fut, False)
        try:
            return await fut
        finally:
            timer.cancel()
            waiters.discard(fut)
            if not waiters and self._waiters.get(key) is waiters:
                del self._waiters[key]

    def notify(self, topic: str, queue_id: int) -> int:
        """Wake every pull parked on this queue; returns how many."""
        waiters = self._waiters.get((topic, queue_id))
        if not waiters:
            return 0
        for fut in waiters:
            _resolve(fut, True)
        return len(waiters)

    def close(self) -> None:
        """Answer every parked pull now (with what is stored) and park no more."""
        self._closing = True
        for waiters in self._waiters.values():
            for fut in waiters:
                _resolve(fut, False)


class _Slot:
    """One held pull counted against the limits (see `LongPollManager.slot`)."""

    __slots__ = ("_manager", "_conn_id")

    def __init__(self, manager: LongPollManager, conn_id: int) -> None:
        self._manager = manager
        self._conn_id = conn_id

    def __enter__(self) -> None:
        self._manager._take_slot(self._conn_id)

    def __exit__(self, *exc: object) -> None:
        self._manager._give_slot(self._conn_id)

    async def __aenter__(self) -> None:
        self._manager._take_slot(self._conn_id)

    async def __aexit__(self, *exc: object) -> None:
        self._manager._give_slot(self._conn_id)


def _ignore(_: str) -> None:
    pass


def _resolve(fut: asyncio.Future[bool], value: bool) -> None:
    if not fut.done():
        fut.set_result(value)
