"""One kombu queue fed from its Ferry topic: the consumer side of the `ferry://` transport.

A `QueueFeed` is a `ferry.Consumer` of the queue's topic in the group
`celery-<queue>`, driven by `consumer.run(handler, concurrency=window)`. Its
handler does not process anything: it puts the record in the feed's inbox
(where kombu's thread takes it) and waits until kombu settles it:

- ack → the handler returns: the record counts as consumed, and the offset is
  committed (on the consumer's auto-commit interval) up to the lowest record
  still unsettled on its queue;
- reject with requeue → `consumer.nack(record, delay_ms=0)`: a copy goes to
  `%RETRY%celery-<queue>` (after `max_reconsume_times` to `%DLQ%celery-<queue>`);
- reject without requeue → consumed (dropped), as AMQP does without a dead-letter exchange;
- not settled within the visibility timeout (`visibility_timeout_s`, counted from
  when the record reached this worker: time in the inbox counts, so a hung worker
  holds nothing past it) → the handler raises `ConsumeTimeoutError`: the runner
  sends the record back (once) with the group's back-off (`%RETRY%`, then `%DLQ%`) and the queue's commit
  moves on; a record still in the inbox is not handed to kombu any more, and
  kombu's late ack or reject is ignored.

Nothing else commits: a worker killed with -9 leaves every unsettled record
uncommitted, and the member that gets the queue after the group rebalances
delivers it again. `stop()` cancels the run: unsettled records are not
committed either (see `ferry.client.consuming.runner`), so a restart loses nothing.
"""
from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import threading
import uuid
from dataclasses import dataclass
from enum import Enum

from ferry.celery.topics import ensure_topic
from ferry.client import Consumer, ConsumerRecord
from ferry.client.consuming.consume_timeout import ConsumeTimeoutError
from ferry.errors import FerryError
from ferry.names import validate_topic

log = logging.getLogger(__name__)

#: The consumer group of kombu queue `q` is GROUP_PREFIX + the topic name.
GROUP_PREFIX = "celery-"
#: Redis's visibility timeout, the one Celery users know (`visibility_timeout` option).
DEFAULT_VISIBILITY_TIMEOUT_S = 3_600.0


class Settlement(Enum):
    """How kombu settled a delivered record."""

    ACK = "ack"            # done: commit past it
    REQUEUE = "requeue"    # deliver again: nack to the retry topic
    DROP = "drop"          # rejected without requeue: commit past it, never again


@dataclass(frozen=True)
class FeedConfig:
    """The consumer settings of every feed of one connection (from transport options)."""

    namesrv: str
    window: int = 64                       # records held at once per queue (unacked included)
    topic_queues: int = 8                  # queues per broker of an auto-created topic
    priority_levels: int = 1               # priority levels of an auto-created topic
    commit_interval_ms: int = 1_000
    heartbeat_interval_ms: int = 2_000
    rebalance_interval_ms: int = 2_000
    pull_max_wait_ms: int = 2_000
    visibility_timeout_s: float = DEFAULT_VISIBILITY_TIMEOUT_S   # taken, not settled: retried

    def __post_init__(self) -> None:
        if not 1 <= self.priority_levels <= 4:
            raise ValueError(f"priority_levels must be 1..4, got {self.priority_levels!r}")
        if not 0 < self.visibility_timeout_s <= 86_400:
            raise ValueError("visibility_timeout must be in (0, 86400] seconds, got "
                             f"{self.visibility_timeout_s!r}")


class QueueFeed:
    """The records of one topic waiting for kombu, and their settlement (runs on the loop)."""

    def __init__(self, topic: str, config: FeedConfig, ready: threading.Event) -> None:
        self.topic = validate_topic(topic)
        self.group = self.group_of(topic)
        self.config = config
        self._ready = ready                       # set when the inbox gets a record
        # Filled by the loop, drained by kombu's thread: deque append/popleft are atomic.
        self._inbox: collections.deque[tuple[str, ConsumerRecord]] = collections.deque()
        self._waiting: dict[str, asyncio.Future[Settlement]] = {}
        self._consumer: Consumer | None = None
        self._run: asyncio.Task[None] | None = None

    @staticmethod
    def group_of(topic: str) -> str:
        """The consumer group of a feed's topic: `celery-<topic>`."""
        return GROUP_PREFIX + topic

    async def start(self) -> None:
        await ensure_topic(self.config.namesrv, self.topic, self.config.topic_queues,
                           self.config.priority_levels)
        c = self.config
        consumer = Consumer(
            self.topic, group=self.group, namesrv=c.namesrv, auto_offset_reset="earliest",
            auto_commit_interval_ms=c.commit_interval_ms,
            heartbeat_interval_ms=c.heartbeat_interval_ms,
            rebalance_interval_ms=c.rebalance_interval_ms, pull_max_wait_ms=c.pull_max_wait_ms,
            request_timeout_ms=c.pull_max_wait_ms + 10_000,
            prefetch_records_per_queue=max(c.window, 32))
        await consumer.start()
        self._consumer = consumer
        self._run = asyncio.get_running_loop().create_task(
            # The feed's own timeout (the run's would also cut a requeue's nack short).
            consumer.run(self._hold, concurrency=c.window, consume_timeout_ms=None),
            name=f"ferry-celery-{self.topic}")

    async def _hold(self, record: ConsumerRecord) -> None:
        """The run() handler: hand `record` to kombu and wait for its outcome."""
        tag = uuid.uuid4().hex
        future: asyncio.Future[Settlement] = asyncio.get_running_loop().create_future()
        self._waiting[tag] = future
        self._inbox.append((tag, record))
        self._ready.set()
        try:
            done, _ = await asyncio.wait((future,), timeout=self.config.visibility_timeout_s)
            if not done:
                raise ConsumeTimeoutError(f"not settled within the visibility timeout "
                                          f"({self.config.visibility_timeout_s:g} s)")
            outcome = future.result()
        finally:
            self._waiting.pop(tag, None)   # kombu's outcome for it is ignored from now on
        if outcome is Settlement.REQUEUE and self._consumer is not None:
            await self._consumer.nack(record, delay_ms=0)

    # -- called from kombu's thread ---------------------------------------------------------
    def take(self) -> tuple[str, ConsumerRecord] | None:
        """The next record for kombu and its delivery tag, or None."""
        while True:
            try:
                tag, record = self._inbox.popleft()
            except IndexError:
                return None
            if tag in self._waiting:   # else its handler ended meanwhile (timed out, stopping)
                return tag, record

    def settle(self, tag: str, outcome: Settlement) -> None:
        """Record kombu's outcome for `tag` (call on the loop: `LoopThread.call_soon`)."""
        future = self._waiting.get(tag)
        if future is not None and not future.done():
            future.set_result(outcome)

    def size(self) -> int:
        return len(self._inbox)

    # -- lifecycle --------------------------------------------------------------------------
    async def stop(self) -> None:
        """Leave the group; what kombu has not settled stays uncommitted (delivered again)."""
        await asyncio.sleep(0)   # settlements already scheduled land first
        if self._run is not None:
            self._run.cancel()
            with contextlib.suppress(asyncio.CancelledError, FerryError):
                await self._run
        self._inbox.clear()
        if self._consumer is not None:
            try:
                await self._consumer.stop()
            except FerryError as exc:
                log.warning("feed of %s: stop failed: %s", self.topic, exc)
