"""SchedulerApp: builds the scheduler's parts, recovers, runs them, stops them cleanly.

Start: load the progress file, open (recover) the local log, open the wheel,
re-derive wheel entries for local records taken after the last progress save,
save progress, serve HTTP; then run the election, the pull loops (leader
only), the delivery loop (every instance: it drains its own wheel), the
progress saver and maintenance. Stop (SIGTERM or SIGINT): stop pulling, stop
handing out due messages, wait for frames in flight (their outcome is
journaled), resign leadership, save progress (fsync), stop HTTP, close the
local log. Each step runs even if an earlier one failed.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any

from ferry.auth.credentials import service_credentials
from ferry.client.core.connection import ConnectionPool
from ferry.client.core.namesrv import NamesrvClient
from ferry.codec import ORIGIN_OFFSET
from ferry.service.app import ServiceApp
from ferry.service.auth import ServiceAuth, auth_stats, start_service_auth
from ferry.service.http import HttpServer
from ferry.service.lifecycle import (
    as_step,
    cancel_task,
    cancel_tasks,
    package_version,
    stop_step,
    stop_tracing,
)
from ferry.telemetry import setup_tracing

from ferry_delay_scheduler import wheel_files
from ferry_delay_scheduler.api import build_app
from ferry_delay_scheduler.cancel import Canceller
from ferry_delay_scheduler.config import ENV_PREFIX, SchedulerConfig
from ferry_delay_scheduler.deliver import Deliverer
from ferry_delay_scheduler.ingest import Ingestor
from ferry_delay_scheduler.leader import LeaderElection
from ferry_delay_scheduler.local_log import LocalLog, parse_origin, record_due
from ferry_delay_scheduler.permissions import ROUTES
from ferry_delay_scheduler.progress import Progress, load_progress, save_progress, source_key
from ferry_delay_scheduler.stats import Stats
from ferry_delay_scheduler.wheel import TimingWheel, now_ms

log = logging.getLogger("ferry_delay_scheduler")

MAINTENANCE_INTERVAL_S = 60.0
RETENTION_EVERY_ROUNDS = 60  # the local log's retention runs hourly
RETENTION_MAX_BEHIND_MS = 3_600_000  # ... and only while the wheel is not behind by more
MINUTE_MS = 60_000
#: The service name of the scheduler's spans.
TRACE_SERVICE = "ferry-delay-scheduler"


class SchedulerApp(ServiceApp):
    """One scheduler instance: `await start()`, then `await stop()` (or `run()` for both)."""

    name = "delay scheduler"
    log = log

    def __init__(self, config: SchedulerConfig) -> None:
        super().__init__(HttpServer("delay-scheduler", ENV_PREFIX),
                         config.http_port)
        self.config = config
        self.node_id = config.node_id
        self.stats = Stats()
        # Its own identity on the wire and HTTP (FERRY_DELAY_SCHEDULER_ACCESS_KEY /
        # _SECRET_KEY, else FERRY_ACCESS_KEY / FERRY_SECRET_KEY; None: unsigned).
        self.credentials = service_credentials("delay-scheduler")
        self.pool = ConnectionPool(request_timeout_ms=config.deliver_timeout_ms,
                                   credentials=self.credentials)
        self.namesrv = NamesrvClient(config.namesrv, credentials=self.credentials)
        # FERRY_AUTH=on: identities from etcd, checked on every route (permissions.py).
        self.auth = (ServiceAuth(config.etcd, config.etcd_prefix, ROUTES) if config.auth
                     else None)
        self.election: LeaderElection | None = None  # made once the HTTP port is bound
        self.local: LocalLog | None = None
        self.wheel: TimingWheel | None = None
        self.progress = Progress()
        self.ingestor: Ingestor | None = None
        self.deliverer: Deliverer | None = None
        self._tasks: dict[str, asyncio.Task[None]] = {}

    # -- roles -----------------------------------------------------------------------

    def is_leader(self) -> bool:
        if not self.config.etcd:
            return True  # no etcd: a single instance, always leading
        return self.election is not None and self.election.is_leader

    def _brokers(self) -> dict[str, str]:
        return self.ingestor.brokers if self.ingestor is not None else {}

    def role(self) -> str:
        return "leader" if self.is_leader() else "standby"

    def leader_addr(self) -> str:
        if self.election is None:
            return f"{self.config.advertise_host or self.config.host}:{self.port}"
        return self.election.leader_addr

    # -- start -----------------------------------------------------------------------

    async def start(self) -> None:
        cfg = self.config
        setup_tracing(TRACE_SERVICE, namesrv=cfg.namesrv)  # spans of traced messages only
        cfg.data_path.mkdir(parents=True, exist_ok=True)
        self.progress = load_progress(cfg.data_path) or Progress(
            closed_below=now_ms() // cfg.bucket_ms)
        self.local = LocalLog(cfg.data_path / "store", segment_bytes=cfg.segment_bytes,
                              flush_interval_ms=cfg.flush_interval_ms,
                              retention_hours=cfg.retention_hours)
        self.wheel = TimingWheel(cfg.data_path / "wheel", bucket_ms=cfg.bucket_ms,
                                 window_ms=cfg.window_ms,
                                 journal_retention_ms=int(cfg.journal_retention_hours * 3_600_000))
        self.wheel.open(self.progress.closed_below)
        self.stats.recovered_entries = self._rederive()
        self.wheel.sync()
        self.progress.bucketed_through = self.local.next_queue_offset
        save_progress(cfg.data_path, self.progress)
        self.deliverer = Deliverer(cfg, self.wheel, self.local, self.pool, self.namesrv,
                                   self.stats, self._brokers)
        self.ingestor = Ingestor(cfg, self.pool, self.namesrv, self.local, self.wheel,
                                 self.progress, self.stats, self.is_leader,
                                 self.deliverer.wake.set)
        canceller = Canceller(self.local, self.wheel, self.stats, self.is_leader,
                              self.leader_addr, cfg.cancel_wait_ms, cfg.deliver_timeout_ms)
        app = build_app(self.stats_document, lambda: self.ready, self.role, canceller,
                        package_version("ferry-delay-scheduler"),
                        auth=await start_service_auth(self.auth), guard=self.http.guard)
        await self.serve_http(app, cfg.host)
        if cfg.etcd:
            http_addr = f"{cfg.advertise_host or cfg.host}:{self.port}"
            self.election = LeaderElection(cfg.etcd, cfg.etcd_prefix, self.node_id, http_addr,
                                           cfg.leader_ttl_s)
        loop = asyncio.get_running_loop()
        if self.election is not None:
            self._tasks["election"] = loop.create_task(self.election.run())
        self._tasks["ingest"] = loop.create_task(self.ingestor.run())
        self._tasks["deliver"] = loop.create_task(self.deliverer.run())
        self._tasks["progress"] = loop.create_task(self._progress_loop())
        self._tasks["maintenance"] = loop.create_task(self._maintenance_loop())
        self._ready = True
        log.info("delay scheduler serving", extra={
            "node": self.node_id, "http": f"{cfg.host}:{self.port}", "data_dir": cfg.data_dir,
            "pending": self.wheel.pending, "recovered_entries": self.stats.recovered_entries,
            "etcd": cfg.etcd or "-", "namesrv": cfg.namesrv})

    def _rederive(self) -> int:
        """Wheel entries for local records taken after the last progress save."""
        assert self.local is not None and self.wheel is not None
        count = 0
        for _, rec in self.local.scan(self.progress.bucketed_through):
            self.wheel.add([(record_due(rec), rec.store_ts_ms, rec.phy_offset)])
            origin = parse_origin(rec.properties.get(ORIGIN_OFFSET, ""))
            if origin is not None:
                key = source_key(origin[0], origin[1])
                self.progress.sources[key] = max(self.progress.sources.get(key, 0),
                                                 origin[2] + 1)
            count += 1
        return count

    # -- background ------------------------------------------------------------------

    async def _progress_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.progress_interval_ms / 1000)
            try:
                await self.save_progress()
            except Exception:  # a full disk, a failed store: keep trying, keep serving
                log.exception("could not save progress; will retry")

    async def save_progress(self) -> None:
        """Close finished buckets, make wheel files durable, then record how far."""
        assert self.wheel is not None and self.ingestor is not None
        self.wheel.close_ready(now_ms())
        snapshot = Progress(self.ingestor.bucketed_through(), self.wheel.closed_below,
                            dict(self.progress.sources))
        wheel = self.wheel
        wheel.stage_writes()
        journals = wheel.take_unsynced()

        def persist() -> None:
            wheel_files.sync_paths(journals + wheel.write_staged(), str(wheel.dir))
            save_progress(self.config.data_path, snapshot)
        await asyncio.to_thread(persist)

    async def _maintenance_loop(self) -> None:
        rounds = 0
        while True:
            await asyncio.sleep(MAINTENANCE_INTERVAL_S)
            rounds += 1
            try:
                assert self.wheel is not None and self.local is not None
                self.wheel.expire_journals(now_ms())
                if rounds % RETENTION_EVERY_ROUNDS == 0 and self._caught_up():
                    await asyncio.to_thread(self.local.store.run_retention)
            except Exception:
                log.exception("maintenance failed; will retry")

    def _caught_up(self) -> bool:
        """True when no bucket older than an hour is still open.

        Retention deletes local segments by age (longer than the longest delay); a
        scheduler that was down for days may still hold messages older than that
        which are due but not yet delivered, so it deletes nothing until it caught up.
        """
        assert self.wheel is not None
        behind_ms = now_ms() - self.wheel.closed_below * self.wheel.bucket_ms
        return behind_ms < RETENTION_MAX_BEHIND_MS

    # -- statistics ------------------------------------------------------------------

    def stats_document(self) -> dict[str, Any]:
        wheel, s = self.wheel, self.stats
        now = now_ms()
        doc: dict[str, Any] = {
            "node_id": self.node_id, "role": self.role(),
            "leader": self.leader_addr(), "taken": s.taken, "delivered": s.delivered,
            "duplicates_after_crash": s.duplicates_after_crash, "cancelled": s.cancelled,
            "delivery_errors": s.delivery_errors, "missing_records": s.missing_records,
            "recovered_entries": s.recovered_entries, "lateness_ms": s.lateness.to_json(),
            "pulling_queues": self.ingestor.pulling if self.ingestor else 0,
        }
        if wheel is not None:
            doc.update({"pending": wheel.pending, "due_next_minute": wheel.due_within(now, MINUTE_MS),
                        "loaded": wheel.loaded, "in_flight": wheel.inflight,
                        "torn_entries": wheel.torn_entries,
                        "closed_below_ms": wheel.closed_below * wheel.bucket_ms})
        doc["auth"] = auth_stats(self.auth.http if self.auth is not None else None)
        return doc

    # -- stop ------------------------------------------------------------------------

    async def stop_steps(self) -> None:
        await stop_step("stop pulling", self._stop_pulling)
        await stop_step("stop delivering", self._stop_delivering)
        if self.election is not None:
            await stop_step("resign leadership", self.election.stop)
        await stop_step("stop background tasks", lambda: cancel_tasks(self._tasks))
        if self.wheel is not None and self.ingestor is not None:
            await stop_step("save progress", self.save_progress)
        await stop_step("stop the HTTP API", self.http.stop)
        if self.auth is not None:
            await stop_step("stop the auth registry", self.auth.stop)
        if self.local is not None:
            await stop_step("close the local log", as_step(self.local.close))
        await stop_step("close broker connections", self.pool.close)
        await stop_step("close the namesrv client", self.namesrv.close)
        await stop_step("stop tracing", stop_tracing)

    async def _stop_pulling(self) -> None:
        await cancel_task(self._tasks, "ingest")
        if self.ingestor is not None:
            await self.ingestor.stop()

    async def _stop_delivering(self) -> None:
        await cancel_task(self._tasks, "deliver")
        if self.deliverer is not None:
            await self.deliverer.drain(self.config.shutdown_timeout_ms / 1000)

