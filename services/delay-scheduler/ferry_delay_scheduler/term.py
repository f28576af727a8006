"""Leadership terms: while an instance leads, it runs one `Term` on a fresh cache.

The brokers' replicated %SCHEDULE% is the truth (see progress.py and
docs/delay.md, "Failover"). When an instance becomes leader, its term:

1. deletes what an earlier term left in `<data_dir>/store` and `<data_dir>/wheel`
   (a cache: nothing there is needed, whatever machine or disk it was);
2. loads the cancel book from etcd (cancels.py), before anything is delivered;
3. pulls %SCHEDULE% from the committed low-water marks into a new local log and
   wheel (ingest.py) and delivers what is due (deliver.py, fenced by `leads`);
4. every `progress_interval_ms`: closes finished buckets, writes bucket entries,
   commits each queue's low-water mark that moved (with its history id), and
   rolls long-pending records (roll.py).

When the instance stops leading (or stops), the term stops pulling, waits for
the frames in flight, commits the marks a last time if it still may, and
closes the cache. A standby holds nothing and delivers nothing.
"""
from __future__ import annotations

import asyncio
import logging
import shutil
from collections.abc import Callable

from ferry.client.core.connection import ConnectionPool
from ferry.client.core.namesrv import NamesrvClient
from ferry.errors import FerryError
from ferry.names import SCHEDULE_TOPIC
from ferry.tasks import cancel_and_wait
from ferry.wire import RequestCode

from ferry_delay_scheduler import wheel_files
from ferry_delay_scheduler.cancels import CancelBook
from ferry_delay_scheduler.config import SchedulerConfig
from ferry_delay_scheduler.deliver import Deliverer
from ferry_delay_scheduler.ingest import GROUP, Ingestor
from ferry_delay_scheduler.local_log import LocalLog
from ferry_delay_scheduler.progress import LowWater
from ferry_delay_scheduler.roll import Roller
from ferry_delay_scheduler.stats import Stats
from ferry_delay_scheduler.wheel import TimingWheel, now_ms

log = logging.getLogger(__name__)

CACHE_DIRS = ("store", "wheel")
OLD_PROGRESS_FILE = "progress.json"  # the single-copy design's file: removed with the cache
MAINTENANCE_EVERY_MS = 60_000
RETENTION_EVERY_MS = 3_600_000
RETENTION_MAX_BEHIND_MS = 3_600_000  # the local log's retention waits while behind more
TERM_POLL_S = 0.05
START_RETRY_S = 1.0


class Term:
    """One leadership term's cache and tasks (see the module doc)."""

    def __init__(self, cfg: SchedulerConfig, pool: ConnectionPool, namesrv: NamesrvClient,
                 stats: Stats, cancels: CancelBook, leads: Callable[[], bool]) -> None:
        self.cfg, self.pool, self.namesrv = cfg, pool, namesrv
        self.stats, self.cancels, self.leads = stats, cancels, leads
        self.started_ms = now_ms()
        root = cfg.data_path
        root.mkdir(parents=True, exist_ok=True)
        for name in CACHE_DIRS:
            shutil.rmtree(root / name, ignore_errors=True)
        (root / OLD_PROGRESS_FILE).unlink(missing_ok=True)
        self.local = LocalLog(root / "store", segment_bytes=cfg.segment_bytes,
                              flush_interval_ms=cfg.flush_interval_ms,
                              retention_hours=cfg.retention_hours)
        self.wheel = TimingWheel(root / "wheel", bucket_ms=cfg.bucket_ms,
                                 window_ms=cfg.window_ms,
                                 journal_retention_ms=int(cfg.journal_retention_hours * 3_600_000))
        self.wheel.open(self.started_ms // cfg.bucket_ms)
        self.low = LowWater()
        self.deliverer = Deliverer(cfg, self.wheel, self.local, pool, namesrv, stats,
                                   self._brokers, leads=leads, cancels=cancels,
                                   settle=self.low.settle)
        self.ingestor = Ingestor(cfg, pool, namesrv, self.local, self.wheel, self.low, cancels,
                                 stats, leads, self.deliverer.wake.set, self.started_ms)
        self.roller = Roller(cfg, pool, self.local, self.wheel, self.low, stats, self._brokers,
                             leads)
        self._tasks: dict[str, asyncio.Task[None]] = {}  # ingest, deliver, upkeep

    def _brokers(self) -> dict[str, str]:
        return self.ingestor.brokers

    async def start(self) -> None:
        loaded = await self.cancels.load()
        loop = asyncio.get_running_loop()
        self._tasks["ingest"] = loop.create_task(self.ingestor.run())
        self._tasks["deliver"] = loop.create_task(self.deliverer.run())
        self._tasks["upkeep"] = loop.create_task(self._upkeep_loop())
        log.info("term started", extra={"cancels": loaded, "node": self.cfg.node_id})

    async def stop(self, drain_s: float) -> None:
        """Stop pulling and delivering, wait for frames in flight, commit, close the cache."""
        for name in ("ingest", "deliver"):
            await cancel_and_wait(self._tasks.pop(name, None))
        await self.ingestor.stop()
        await self.deliverer.drain(drain_s)
        await cancel_and_wait(self._tasks.pop("upkeep", None))
        try:
            await self.commit_marks()
        except Exception:  # the next term re-reads from the last commit: nothing is lost
            log.exception("last commit of the low-water marks failed")
        try:
            await asyncio.to_thread(self.wheel.sync)  # leave the cache's files whole
        finally:
            self.local.close()

    # -- upkeep ----------------------------------------------------------------------

    async def _upkeep_loop(self) -> None:
        last_maintenance = last_retention = now_ms()
        while True:
            await asyncio.sleep(self.cfg.progress_interval_ms / 1000)
            try:
                await self.upkeep()
                now = now_ms()
                if now - last_maintenance >= MAINTENANCE_EVERY_MS:
                    last_maintenance = now
                    self.wheel.expire_journals(now)
                if now - last_retention >= RETENTION_EVERY_MS and self._caught_up(now):
                    last_retention = now
                    await asyncio.to_thread(self.local.store.run_retention)
            except Exception:  # a full disk, a failed store: keep trying, keep serving
                log.exception("term upkeep failed; will retry")

    async def upkeep(self) -> None:
        """Close finished buckets, write bucket entries, roll, commit the marks."""
        wheel = self.wheel
        wheel.close_ready(now_ms())
        wheel.stage_writes()
        journals = wheel.take_unsynced()

        def persist() -> None:
            wheel_files.sync_paths(journals + wheel.write_staged(), str(wheel.dir))
        await asyncio.to_thread(persist)
        if self.leads():
            await self.roller.roll()
        await self.commit_marks()

    async def commit_marks(self) -> None:
        """COMMIT_OFFSET each queue's low-water mark that moved (only while leading)."""
        for mark in list(self.low.marks.values()):
            offset, hist = mark.low_water()
            if (offset, hist) == mark.committed or not self.leads():
                continue
            addr = self.ingestor.brokers.get(mark.broker)
            if not addr:
                continue
            fields: dict[str, object] = {"group": GROUP, "topic": SCHEDULE_TOPIC,
                                         "queue_id": mark.queue_id, "offset": offset}
            if hist is not None:
                fields["hist"] = hist
            try:
                await self.pool.request(addr, RequestCode.COMMIT_OFFSET, fields)
                mark.committed = (offset, hist)
            except FerryError as exc:
                log.warning("commit of %%SCHEDULE%% %s/%d at %d failed: %s", mark.broker,
                            mark.queue_id, offset, exc)

    def _caught_up(self, now: int) -> bool:
        """No bucket older than an hour is open (retention waits for a backlog to go out)."""
        return now - self.wheel.closed_below * self.wheel.bucket_ms < RETENTION_MAX_BEHIND_MS


class Terms:
    """Starts a `Term` when this instance becomes leader and stops it when it is not."""

    def __init__(self, cfg: SchedulerConfig, pool: ConnectionPool, namesrv: NamesrvClient,
                 stats: Stats, cancels: CancelBook, is_leader: Callable[[], bool],
                 leads: Callable[[], bool]) -> None:
        self.cfg, self.pool, self.namesrv = cfg, pool, namesrv
        self.stats, self.cancels = stats, cancels
        self.is_leader, self.leads = is_leader, leads
        self.current: Term | None = None
        self.terms = 0

    async def run(self) -> None:
        while True:
            leading = self.is_leader()
            if leading and self.current is None:
                term = None
                try:
                    term = await asyncio.to_thread(
                        Term, self.cfg, self.pool, self.namesrv, self.stats, self.cancels,
                        self.leads)
                    await term.start()
                except Exception:
                    log.exception("could not start a term; will retry")
                    if term is not None:
                        term.local.close()
                    await asyncio.sleep(START_RETRY_S)
                    continue
                self.current = term
                self.terms += 1
            elif not leading and self.current is not None:
                await self.stop()
            await asyncio.sleep(TERM_POLL_S)

    async def stop(self) -> None:
        term, self.current = self.current, None
        if term is not None:
            await term.stop(self.cfg.shutdown_timeout_ms / 1000)
            log.info("term ended", extra={"node": self.cfg.node_id})
