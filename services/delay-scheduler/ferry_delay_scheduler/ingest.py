"""Taking over %SCHEDULE%: pull every broker's schedule queues into the local log.

While this instance leads, one task per (broker, queue) of the %SCHEDULE%
route long-polls PULL as group `ferry-delay-scheduler`, appends what it gets
to the local log, waits until the local commit log is fdatasync'd past it,
adds the messages to the timing wheel, and only then commits the broker
offset (COMMIT_OFFSET). A crash anywhere loses nothing: before the local
fsync the broker offset is not committed (the record is pulled again); after
it the local copy is durable and recovery re-derives its wheel entry.
"""
from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Callable
from contextlib import ExitStack

from ferry.client.connection import ConnectionPool
from ferry.client.namesrv import NamesrvClient, TopicRoute
from ferry.codec import iter_records
from ferry.errors import (
    CorruptRecordError,
    FerryError,
    FlushTimeoutError,
    MessageNotFoundError,
    TopicNotFoundError,
)
from ferry.names import SCHEDULE_TOPIC
from ferry.service.lifecycle import KeyedTasks
from ferry.wire import RequestCode

from ferry_delay_scheduler.config import SchedulerConfig
from ferry_delay_scheduler.local_log import LocalLog
from ferry_delay_scheduler.progress import Progress, source_key
from ferry_delay_scheduler.stats import Stats
from ferry_delay_scheduler.tracing import schedule_spans
from ferry_delay_scheduler.wheel import TimingWheel

log = logging.getLogger(__name__)

GROUP = "ferry-delay-scheduler"
ERROR_BACKOFF_S = 1.0
# How long past the long-poll wait a PULL may take before it counts as lost.
PULL_SLACK_MS = 5000
# Answers that move the position, perhaps back: HISTORY_DIVERGED (the broker's log is not
# the continuation of what was read; `hist` names it, issue 16) and OFFSET_OVERFLOW_BADLY
# (sent to the start of the queue's newest history, never its end) re-read rather than skip.
_NEEDS_RESEEK = ("OFFSET_TOO_SMALL", "OFFSET_OVERFLOW_BADLY", "HISTORY_DIVERGED")


async def fetch_route(namesrv: NamesrvClient, topic: str) -> TopicRoute | None:
    """A topic's route; None when namesrv has none."""
    try:
        return await namesrv.get_route(topic)
    except (TopicNotFoundError, MessageNotFoundError):
        return None


class Ingestor:
    """Keeps one pull task per %SCHEDULE% queue while `is_leader()` holds."""

    def __init__(self, cfg: SchedulerConfig, pool: ConnectionPool, namesrv: NamesrvClient,
                 local: LocalLog, wheel: TimingWheel, progress: Progress, stats: Stats,
                 is_leader: Callable[[], bool], on_added: Callable[[], None]) -> None:
        self.cfg = cfg
        self.pool = pool
        self.namesrv = namesrv
        self.local = local
        self.wheel = wheel
        self.progress = progress
        self.stats = stats
        self.is_leader = is_leader
        self.on_added = on_added  # wakes the delivery loop
        #: broker name -> master address, from the last %SCHEDULE% route
        self.brokers: dict[str, str] = {}
        self._tasks: KeyedTasks[tuple[str, str, int]] = KeyedTasks()
        # Local queue offsets of appends still waiting for the local fsync (see bucketed_through).
        self._unsettled: dict[int, int] = {}
        self._tokens = itertools.count()
        self._took = asyncio.Event()

    def bucketed_through(self) -> int:
        """Local queue offset below which every record is in the wheel (see progress.py)."""
        nxt = self.local.next_queue_offset
        return min(self._unsettled.values(), default=nxt)

    async def run(self) -> None:
        while True:
            try:
                await self.reconcile()
            except asyncio.CancelledError:
                raise
            except Exception:  # the loop must outlive any one failure
                log.exception("reconciling the pull tasks failed; going on")
            await asyncio.sleep(self.cfg.route_poll_ms / 1000)

    async def reconcile(self) -> None:
        """Match the pull tasks to the current route and leadership."""
        want: set[tuple[str, str, int]] = set()
        try:  # every instance needs the broker map: it delivers to the brokers by name
            route = await fetch_route(self.namesrv, SCHEDULE_TOPIC)
        except FerryError as exc:
            log.warning("cannot read the %%SCHEDULE%% route: %s", exc)
            return
        if route is not None:
            self.brokers = {b.name: b.master for b in route.brokers if b.master}
            if self.is_leader():
                want = {(b.name, b.master, q) for b in route.brokers
                        if b.master and b.readable for q in range(b.queues)}
        await self._tasks.reconcile(want, lambda key: self._pull_loop(*key),
                                    lambda key: f"pull-{key[0]}-{key[2]}")

    async def stop(self) -> None:
        await self._tasks.stop()

    @property
    def pulling(self) -> int:
        return len(self._tasks)

    async def wait_taken(self, timeout_s: float) -> None:
        """Wait until the next batch is taken over (or the timeout passes)."""
        self._took.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._took.wait(), timeout_s)

    async def _start_offset(self, broker: str, addr: str, qid: int) -> int:
        resp = await self.pool.request(addr, RequestCode.QUERY_OFFSET, {
            "group": GROUP, "topic": SCHEDULE_TOPIC, "queue_id": qid})
        committed = int(resp.fields.get("offset", -1))
        return max(committed, self.progress.sources.get(source_key(broker, qid), 0), 0)

    async def _pull_loop(self, broker: str, addr: str, qid: int) -> None:
        offset: int | None = None
        hist: str | None = None   # history of the record before `offset` (issue 16)
        fields = {"group": GROUP, "topic": SCHEDULE_TOPIC, "queue_id": qid,
                  "max_count": self.cfg.pull_max_count, "max_wait_ms": self.cfg.pull_max_wait_ms,
                  "tags": None, "sql": None}
        while self.is_leader():  # a deposed leader stops at once, not at the next reconcile
            try:
                if offset is None:
                    offset = await self._start_offset(broker, addr, qid)
                pull = {**fields, "offset": offset, **({"hist": hist} if hist else {})}
                resp = await self.pool.request(
                    addr, RequestCode.PULL, pull,
                    timeout_ms=self.cfg.pull_max_wait_ms + PULL_SLACK_MS)
                status = str(resp.fields.get("status", ""))
                next_offset = int(resp.fields.get("next_offset", offset))
                got_hist = resp.fields.get("hist")
                if isinstance(got_hist, str) and (next_offset != offset
                                                  or status == "HISTORY_DIVERGED"):
                    hist = got_hist
                if status == "FOUND":
                    records = list(iter_records(resp.body))
                    await self._take(broker, addr, qid, records, next_offset)
                    offset = next_offset
                elif status in _NEEDS_RESEEK:
                    log.warning("%%SCHEDULE%% %s/%d: offset %d %s; continuing at %d",
                                broker, qid, offset, status, next_offset)
                    offset = next_offset
                elif status == "NO_MATCHED_MESSAGE":
                    offset = max(offset, next_offset)
            except asyncio.CancelledError:
                raise
            except (FerryError, CorruptRecordError, OSError) as exc:
                log.warning("pull of %%SCHEDULE%% %s/%d failed: %s", broker, qid, exc)
                await asyncio.sleep(ERROR_BACKOFF_S)

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
