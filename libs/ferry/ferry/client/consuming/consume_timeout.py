"""Consume timeout: how long one handler call of `consumer.run` may hold its record.

RocketMQ's `consumeTimeout` (15 minutes): a handler still running past it no
longer holds its queue. In `run(handler)` the runner then sends the record
back as if the handler had raised (SEND_BACK with the group's back-off; past
`max_reconsume_times`, to `%DLQ%<group>`), exactly once, and the queue's
commit moves on once the broker stored the copy. The late handler is
cancelled (an `async` handler stops at its next `await`; a thread it waits
on, `asyncio.to_thread`, runs on), and whatever it does afterwards, return or
raise, is ignored: its position was handed to the retry already.

Ordered consumption (`run(handler, ordered=True)`) cannot let the queue move
on: a timeout is a failed attempt there, retried in place after `suspend_ms`
like an exception (see `runner.OrderedRunner`).
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from ferry.client.core.message import ConsumerRecord

log = logging.getLogger(__name__)

#: RocketMQ's default consumeTimeout.
DEFAULT_CONSUME_TIMEOUT_MS = 15 * 60_000
#: The longest timeout accepted (one day); None turns the timeout off.
MAX_CONSUME_TIMEOUT_MS = 86_400_000


class ConsumeTimeoutError(TimeoutError):
    """The handler ran past `consume_timeout_ms` (how a timeout reads in logs and in ordered mode)."""


def check_consume_timeout(consume_timeout_ms: object) -> float | None:
    """The timeout in seconds (None: off); ValueError for anything but 1..MAX ms or None."""
    if consume_timeout_ms is None:
        return None
    if (isinstance(consume_timeout_ms, bool) or not isinstance(consume_timeout_ms, int)
            or not 1 <= consume_timeout_ms <= MAX_CONSUME_TIMEOUT_MS):
        raise ValueError(f"consume_timeout_ms must be an integer in 1..{MAX_CONSUME_TIMEOUT_MS} "
                         f"or None, got {consume_timeout_ms!r}")
    return consume_timeout_ms / 1000


class Deadlines:
    """The deadlines of the handler tasks of one runner: `expire(task)` runs when one is late.

    A deadline is set when a handler starts and dropped when it ends; `disarm`
    says whether the task expired meanwhile (then its outcome is not its own).
    Every task gets the same timeout, so deadlines come in the order tasks start:
    they are kept in that order, and ONE timer waits for the oldest (at its due
    time the due ones expire and the timer waits for the next), instead of a
    timer per record armed and cancelled around every handler call.
    """

    def __init__(self, timeout_s: float | None, expire: Callable[[asyncio.Task[Any]], None]
                 ) -> None:
        self.timeout_s = timeout_s
        self._expire = expire
        self._due: dict[asyncio.Task[Any], float] = {}   # in start order, so in due order
        self._timer: asyncio.TimerHandle | None = None
        self.expired: set[asyncio.Task[Any]] = set()

    def arm(self, task: asyncio.Task[Any]) -> None:
        if self.timeout_s is not None:
            loop = task.get_loop()
            due = self._due[task] = loop.time() + self.timeout_s
            if self._timer is None:
                self._timer = loop.call_at(due, self._fire, loop)

    def _fire(self, loop: asyncio.AbstractEventLoop) -> None:
        self._timer = None
        due = self._due
        now = loop.time()
        while due:
            task, when = next(iter(due.items()))
            if when > now:
                self._timer = loop.call_at(when, self._fire, loop)
                return
            del due[task]
            if not task.done():
                self.expired.add(task)
                self._expire(task)

    def disarm(self, task: asyncio.Task[Any] | None) -> bool:
        """Drop `task`'s deadline; True if it had expired (its late outcome is to be ignored)."""
        due = self._due
        if task is not None and due.pop(task, None) is not None and not due:
            if self._timer is not None:   # nothing left to wait for
                self._timer.cancel()
                self._timer = None
        return task in self.expired

    def forget(self, task: asyncio.Task[Any]) -> None:
        """`task` ended: drop what is kept of it."""
        self.disarm(task)
        self.expired.discard(task)


async def call_within(handler: Callable[[ConsumerRecord], Awaitable[Any]],
                      record: ConsumerRecord, timeout_s: float | None) -> None:
    """`await handler(record)`, cancelled past `timeout_s`: then ConsumeTimeoutError (a
    handler that returns after it was cancelled timed out too: its result is not used)."""
    try:
        async with asyncio.timeout(timeout_s) as clock:
            await handler(record)
    except TimeoutError:
        if not clock.expired():
            raise   # the handler's own
    if clock.expired():
        raise ConsumeTimeoutError(f"the handler ran past the consume timeout "
                                  f"({(timeout_s or 0) * 1000:.0f} ms)")


def ignore_late(record: ConsumerRecord, exc: Exception | None) -> None:
    """A handler that ended after its consume timeout: its outcome is ignored (logged)."""
    outcome = f"raised {exc!r}" if exc is not None else "returned"
    log.info("handler on %s (%s offset %d) ended after its consume timeout (%s); ignored: "
             "the record was sent back already", record.msg_id, record.topic_queue,
             record.queue_offset, outcome)
