"""Following the queues of a route: one long-polling PULL task per queue.

What the services' readers of internal topics share (the delay scheduler on
`%SCHEDULE%`, the transaction checker on `%HALF%` and `%OP%`, each a
subclass): a `QueueReader` polls namesrv for one topic's route every
`route_poll_ms`, asks its `queues` hook which queues to read (`ReadQueue`:
broker, address, topic, queue), and keeps one task per queue. Each task asks
`open` where to start (a `Cursor`: offset and history id), then, while
`ready`, PULLs with long polling and applies each answer (`apply`):

- FOUND: `take` takes the records (stores them, commits or checkpoints) and
  says where to read next (short of `next_offset` when it could not take
  them all);
- OFFSET_TOO_SMALL, OFFSET_OVERFLOW_BADLY, HISTORY_DIVERGED: the position
  goes to `next_offset`, back too (records are read again, never skipped),
  with one WARNING;
- anything else: the position moves to `next_offset` if that is further
  (records the broker skipped).

Histories (issue 16): each PULL carries the cursor's `hist`, the history of
the record before its offset; after an answer that leaves the position at its
`next_offset` the cursor takes the answer's `hist`; a position moved anywhere
else names none until the next answer. Failures (network, a corrupt record,
`take`'s) are logged and the PULL is tried again after a pause.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from ferry.client.core.connection import ConnectionPool
from ferry.client.core.namesrv import NamesrvClient, TopicRoute
from ferry.client.reading.ranges import pull
from ferry.codec.record import StoredMessage
from ferry.errors import CorruptRecordError, FerryError, MessageNotFoundError, TopicNotFoundError
from ferry.tasks import KeyedTasks, repeat
from ferry.wire.pull import PullAnswer, PullRequest

log = logging.getLogger(__name__)

#: How long past the long-poll wait a PULL may take before it counts as lost.
PULL_SLACK_MS = 5000
ERROR_BACKOFF_S = 1.0
_FAILURES = (FerryError, CorruptRecordError, OSError)


def now_ms() -> int:
    return int(time.time() * 1000)


async def route_or_none(namesrv: NamesrvClient, topic: str) -> TopicRoute | None:
    """A topic's route; None when namesrv has none."""
    try:
        return await namesrv.get_route(topic)
    except (TopicNotFoundError, MessageNotFoundError):
        return None


@dataclass(frozen=True, slots=True)
class ReadQueue:
    """One queue a reader follows, at the broker address the route named."""

    broker: str
    addr: str
    topic: str
    queue_id: int


class Cursor:
    """Where a queue's reading stands: the next offset, and the history id of the
    record before it (None: not known, the broker checks nothing).

    A reader whose positions live elsewhere (a checkpointed book) subclasses it
    with an `offset` property."""

    def __init__(self, offset: int, hist: str | None = None) -> None:
        self.offset = offset
        self.hist = hist

    def follow(self, answer: PullAnswer, before: int) -> None:
        """Keep the history the answer names for the position now (see the module doc)."""
        if answer.hist is not None and self.offset == answer.next_offset:
            self.hist = answer.hist
        elif self.offset != before:
            self.hist = None


@dataclass(frozen=True, slots=True)
class ReadConfig:
    """How a reader pulls: as which group, how much, how long a PULL waits at the broker."""

    group: str
    max_count: int
    max_wait_ms: int
    route_poll_ms: int


@dataclass(eq=False)
class QueueReader:
    """Keeps one pull task per queue of `topic`'s route.

    A user subclasses it and overrides the hooks (`queues`, `open`, `ready`,
    `take`, `answered`); each has a default: every queue of every readable
    master, from offset 0, taking the records as they come."""

    pool: ConnectionPool
    namesrv: NamesrvClient
    topic: str
    config: ReadConfig
    #: broker name -> master address, from the last route
    brokers: dict[str, str] = field(default_factory=dict, init=False)
    _tasks: KeyedTasks[ReadQueue] = field(default_factory=KeyedTasks, init=False, repr=False)

    # -- hooks ---------------------------------------------------------------------------

    def queues(self, route: TopicRoute) -> Iterable[ReadQueue]:
        """The queues to read now (default: every queue of every readable master)."""
        return [ReadQueue(b.name, b.master, self.topic, q) for b in route.brokers
                if b.master and b.readable for q in range(b.queues)]

    async def open(self, queue: ReadQueue) -> Cursor:
        """Where a new task starts reading `queue` (called again after a failure)."""
        return Cursor(0)

    async def ready(self, queue: ReadQueue) -> bool:
        """Before each PULL: False ends the task; may wait (a pause) before it answers."""
        return True

    async def take(self, queue: ReadQueue, records: list[StoredMessage],
                   answer: PullAnswer) -> int:
        """Take the records of a FOUND answer (store, commit, checkpoint them); the offset
        to read next (short of `answer.next_offset` when not all were taken)."""
        return answer.next_offset

    def answered(self, queue: ReadQueue, answer: PullAnswer, sent_ms: int) -> None:
        """After each answer was applied (`sent_ms`: when its PULL was sent)."""

    # -- the loops -----------------------------------------------------------------------

    async def run(self) -> None:
        await repeat(self.reconcile, log, f"reconciling the pull tasks of {self.topic}",
                     pause_s=self.config.route_poll_ms / 1000)

    async def reconcile(self) -> None:
        """Match the pull tasks to the current route (no route: no tasks)."""
        try:
            route = await route_or_none(self.namesrv, self.topic)
        except FerryError as exc:
            log.warning("cannot read the route of %s: %s", self.topic, exc)
            return
        want: set[ReadQueue] = set()
        if route is not None:
            self.brokers = {b.name: b.master for b in route.brokers if b.master}
            want = set(self.queues(route))
        await self._tasks.reconcile(want, self._follow,
                                    lambda q: f"read-{q.topic}-{q.broker}-{q.queue_id}")

    async def stop(self) -> None:
        await self._tasks.stop()

    @property
    def pulling(self) -> int:
        return len(self._tasks)

    async def _follow(self, queue: ReadQueue) -> None:
        c = self.config
        cursor: Cursor | None = None
        while await self.ready(queue):
            try:
                if cursor is None:
                    cursor = await self.open(queue)
                request = PullRequest(c.group, queue.topic, queue.queue_id, cursor.offset,
                                      c.max_count, c.max_wait_ms, hist=cursor.hist)
                sent_ms = now_ms()
                answer = await pull(self.pool, queue.addr, request,
                                    timeout_ms=c.max_wait_ms + PULL_SLACK_MS)
                await self.apply(queue, cursor, answer, sent_ms)
            except asyncio.CancelledError:
                raise
            except _FAILURES as exc:
                log.warning("pull of %s %s/%d failed: %s", queue.topic, queue.broker,
                            queue.queue_id, exc)
                await asyncio.sleep(ERROR_BACKOFF_S)

    async def apply(self, queue: ReadQueue, cursor: Cursor, answer: PullAnswer,
                    sent_ms: int) -> None:
        """Move `cursor` as `answer` says (see the module doc); records go to `take`."""
        before = cursor.offset
        if answer.found:
            cursor.offset = await self.take(queue, answer.stored(), answer)
        elif answer.status.reseeks:
            log.warning("%s %s/%d: offset %d %s; continuing at %d", queue.topic, queue.broker,
                        queue.queue_id, before, answer.status.value, answer.next_offset)
            cursor.offset = answer.next_offset
        elif answer.next_offset > before:
            cursor.offset = answer.next_offset
        self.answered(queue, answer, sent_ms)
        cursor.follow(answer, before)
