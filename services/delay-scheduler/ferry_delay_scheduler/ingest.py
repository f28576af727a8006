"""Taking over %SCHEDULE%: pull every broker's schedule queues into the local log.

While this instance leads, one task per (broker, queue) of the %SCHEDULE%
route long-polls PULL as group `ferry-delay-scheduler`, appends what it gets
to the local log, waits until the local commit log is fdatasync'd past it,
adds the messages to the timing wheel, and only then commits the broker
offset (COMMIT_OFFSET). A crash anywhere loses nothing: before the local
fsync the broker offset is not committed (the record is pulled again); after
it the local copy is durable and recovery re-derives its wheel entry. The
route polling, the tasks, the long polls, re-seeks and history ids are the
library's `QueueReader` (ferry.client.reading); this module is its handler.
"""
from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Callable, Iterable
from contextlib import ExitStack

from ferry.client.core.connection import ConnectionPool
from ferry.client.core.namesrv import NamesrvClient, TopicRoute
from ferry.client.reading import Cursor, QueueReader, ReadConfig, ReadQueue
from ferry.codec.record import StoredMessage
from ferry.errors import FerryError, FlushTimeoutError
from ferry.names import SCHEDULE_TOPIC
from ferry.wire import PullAnswer, RequestCode

from ferry_delay_scheduler.config import SchedulerConfig
from ferry_delay_scheduler.local_log import LocalLog
from ferry_delay_scheduler.progress import Progress, source_key
from ferry_delay_scheduler.stats import Stats
from ferry_delay_scheduler.tracing import schedule_spans
from ferry_delay_scheduler.wheel import TimingWheel

log = logging.getLogger(__name__)

GROUP = "ferry-delay-scheduler"


class Ingestor(QueueReader):
    """Keeps one pull task per %SCHEDULE% queue while `is_leader()` holds.

    `brokers` (from the last %SCHEDULE% route) is kept by every instance, leader or
    not: it delivers to the brokers by name."""

    def __init__(self, cfg: SchedulerConfig, pool: ConnectionPool, namesrv: NamesrvClient,
                 local: LocalLog, wheel: TimingWheel, progress: Progress, stats: Stats,
                 is_leader: Callable[[], bool], on_added: Callable[[], None]) -> None:
        super().__init__(pool, namesrv, SCHEDULE_TOPIC, ReadConfig(
            GROUP, cfg.pull_max_count, cfg.pull_max_wait_ms, cfg.route_poll_ms))
        self.cfg = cfg
        self.local = local
        self.wheel = wheel
        self.progress = progress
        self.stats = stats
        self.is_leader = is_leader
        self.on_added = on_added  # wakes the delivery loop
        # Local queue offsets of appends still waiting for the local fsync (see bucketed_through).
        self._unsettled: dict[int, int] = {}
        self._tokens = itertools.count()
        self._took = asyncio.Event()

    def bucketed_through(self) -> int:
        """Local queue offset below which every record is in the wheel (see progress.py)."""
        nxt = self.local.next_queue_offset
        return min(self._unsettled.values(), default=nxt)

    async def wait_taken(self, timeout_s: float) -> None:
        """Wait until the next batch is taken over (or the timeout passes)."""
        self._took.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._took.wait(), timeout_s)

    # -- QueueReader hooks ---------------------------------------------------------------------

    def queues(self, route: TopicRoute) -> Iterable[ReadQueue]:
        return super().queues(route) if self.is_leader() else []

    async def ready(self, queue: ReadQueue) -> bool:
        return self.is_leader()  # a deposed leader stops at once, not at the next reconcile

    async def open(self, queue: ReadQueue) -> Cursor:
        resp = await self.pool.request(queue.addr, RequestCode.QUERY_OFFSET, {
            "group": GROUP, "topic": SCHEDULE_TOPIC, "queue_id": queue.queue_id})
        committed = int(resp.fields.get("offset", -1))
        taken = self.progress.sources.get(source_key(queue.broker, queue.queue_id), 0)
        return Cursor(max(committed, taken, 0))

    async def take(self, queue: ReadQueue, records: list[StoredMessage],
                   answer: PullAnswer) -> int:
        await self._take(queue.broker, queue.addr, queue.queue_id, records, answer.next_offset)
        return answer.next_offset

    async def _take(self, broker: str, addr: str, qid: int, records: list, next_offset: int
                    ) -> None:
        """Local append, local fsync, wheel, progress, broker commit: in that order."""
        if not records:
            return
        with ExitStack() as spans:  # the schedule spans of traced records (see tracing.py)
            trace = schedule_spans(spans, records, broker, self.cfg.node_id)
            stored, end = self.local.append(broker, records, trace)
            token = next(self._tokens)
            self._unsettled[token] = self.local.next_queue_offset - len(stored)
            try:
                while True:
                    try:
                        await self.local.durable(end)
                        break
                    except FlushTimeoutError:
                        log.warning("local log not durable yet; waiting on")
                self.wheel.add([(s.due_ms, s.stored_ms, s.phy_offset) for s in stored])
                self.on_added()
            finally:
                del self._unsettled[token]
        key = source_key(broker, qid)
        self.progress.sources[key] = max(self.progress.sources.get(key, 0), next_offset)
        self.stats.taken += len(stored)
        self._took.set()
        try:
            await self.pool.request(addr, RequestCode.COMMIT_OFFSET, {
                "group": GROUP, "topic": SCHEDULE_TOPIC, "queue_id": qid, "offset": next_offset})
        except FerryError as exc:  # the local progress keeps us from taking them twice
            log.warning("commit of %%SCHEDULE%% %s/%d at %d failed: %s", broker, qid,
                        next_offset, exc)
