"""Taking over %SCHEDULE%: pull every broker's schedule queues into this term's cache.

While this instance leads, one task per (broker, queue) of the %SCHEDULE%
route long-polls PULL as group `ferry-delay-scheduler`, appends what it gets
to the local log (a cache of this term, see term.py), adds the messages to the
timing wheel and notes them in the low-water marks (progress.py). Nothing is
committed here: the mark moves, and is committed, only past what was settled.

A queue is first read from its committed offset and history id (QUERY_OFFSET);
a broker that answers HISTORY_DIVERGED (its queue history was replaced) sends
the reader back: what was taken past that point stays in the cache and is
delivered, and the records now stored there are taken too (re-read, never
skipped). A message cancelled in the replicated cancel book is not taken.
The route polling, the tasks, the long polls, re-seeks and history ids are the
library's `QueueReader` (ferry.client.reading); this module is its handler.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable
from contextlib import ExitStack

from ferry.client.core.connection import ConnectionPool
from ferry.client.core.namesrv import NamesrvClient, TopicRoute
from ferry.client.reading import Cursor, QueueReader, ReadConfig, ReadQueue
from ferry.codec.record import StoredMessage
from ferry.names import SCHEDULE_TOPIC
from ferry.wire import PullAnswer, RequestCode

from ferry_delay_scheduler.cancels import CancelBook
from ferry_delay_scheduler.config import SchedulerConfig
from ferry_delay_scheduler.local_log import LocalLog, due_of
from ferry_delay_scheduler.progress import LowWater
from ferry_delay_scheduler.stats import Stats
from ferry_delay_scheduler.tracing import schedule_spans
from ferry_delay_scheduler.wheel import TimingWheel

log = logging.getLogger(__name__)

GROUP = "ferry-delay-scheduler"


class Ingestor(QueueReader):
    """Keeps one pull task per %SCHEDULE% queue while `leads()` holds (one term)."""

    def __init__(self, cfg: SchedulerConfig, pool: ConnectionPool, namesrv: NamesrvClient,
                 local: LocalLog, wheel: TimingWheel, low: LowWater, cancels: CancelBook,
                 stats: Stats, leads: Callable[[], bool], on_added: Callable[[], None],
                 started_ms: int) -> None:
        super().__init__(pool, namesrv, SCHEDULE_TOPIC, ReadConfig(
            GROUP, cfg.pull_max_count, cfg.pull_max_wait_ms, cfg.route_poll_ms))
        self.cfg = cfg
        self.local = local
        self.wheel = wheel
        self.low = low
        self.cancels = cancels
        self.stats = stats
        self.leads = leads
        self.on_added = on_added  # wakes the delivery loop
        self.started_ms = started_ms  # when this term began
        self._took = asyncio.Event()

    async def wait_taken(self, timeout_s: float) -> None:
        """Wait until the next batch is taken over (or the timeout passes)."""
        self._took.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._took.wait(), timeout_s)

    def _maybe_settled(self, rec: StoredMessage) -> bool:
        """Stored before this term began and either due before it (the previous leader
        may have delivered it) or older than `roll_after_ms` then (it may have rolled
        it: a newer copy exists). Sent again, it counts in duplicates_after_crash."""
        started = self.started_ms
        return rec.store_ts_ms < started and (
            due_of(rec.properties, rec.store_ts_ms) < started
            or rec.store_ts_ms < started - self.cfg.roll_after_ms)

    # -- QueueReader hooks ---------------------------------------------------------------------

    def queues(self, route: TopicRoute) -> Iterable[ReadQueue]:
        return super().queues(route) if self.leads() else []

    async def ready(self, queue: ReadQueue) -> bool:
        return self.leads()  # a deposed leader stops at once, not at the next reconcile

    async def open(self, queue: ReadQueue) -> Cursor:
        mark = self.low.mark(queue.broker, queue.queue_id)
        if mark is None:
            resp = await self.pool.request(queue.addr, RequestCode.QUERY_OFFSET, {
                "group": GROUP, "topic": SCHEDULE_TOPIC, "queue_id": queue.queue_id})
            committed = int(resp.fields.get("offset", -1))
            hist = resp.fields.get("hist") if committed > 0 else None
            mark = self.low.open(queue.broker, queue.queue_id, max(committed, 0),
                                 str(hist) if hist else None)
        return Cursor(mark.taken, mark.hist)

    async def take(self, queue: ReadQueue, records: list[StoredMessage],
                   answer: PullAnswer) -> int:
        mark = self.low.open(queue.broker, queue.queue_id, 0, None)
        if records and records[0].queue_offset < mark.taken:
            detached = self.low.rewind(mark, records[0].queue_offset, None)
            log.warning("%%SCHEDULE%% %s/%d: history replaced; reading again from %d "
                        "(%d held records stay scheduled)", queue.broker, queue.queue_id,
                        records[0].queue_offset, detached)
        cancelled = self.cancels.contains
        fresh = [r for r in records if not cancelled(r.msg_id)]
        taken: list[tuple[int, int]] = []
        if fresh:
            with ExitStack() as spans:  # the schedule spans of traced records (see tracing.py)
                trace = schedule_spans(spans, fresh, queue.broker, self.cfg.node_id)
                stored, _ = self.local.append(queue.broker, fresh, trace)
            self.wheel.add([(s.due_ms, s.stored_ms, s.phy_offset) for s in stored])
            self.wheel.suspect([s.phy_offset for r, s in zip(fresh, stored, strict=True)
                                if self._maybe_settled(r)])
            taken = [(r.queue_offset, s.phy_offset) for r, s in zip(fresh, stored, strict=True)]
            self.stats.taken += len(stored)
            self.on_added()
        self.low.add(mark, taken, answer.next_offset, answer.hist)
        self._took.set()
        return answer.next_offset
