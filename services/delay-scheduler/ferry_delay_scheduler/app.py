"""SchedulerApp: builds the scheduler's parts, recovers, runs them, stops them cleanly.

Start: serve HTTP, then run the election and the terms (term.py): while this
instance leads, a term pulls %SCHEDULE% into a fresh cache and delivers; a
standby holds nothing. Stop (SIGTERM or SIGINT): end the term (stop pulling,
wait for frames in flight, commit the low-water marks), resign leadership,
stop HTTP. Each step runs even if an earlier one failed.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any

from ferry.service.app import ServiceApp
from ferry.service.auth import auth_stats, start_service_auth
from ferry.service.http import METRICS, HttpServer
from ferry.service.lifecycle import (
    cancel_task,
    cancel_tasks,
    package_version,
    stop_step,
    stop_tracing,
)
from ferry.service.mesh import MeshClients
from ferry.telemetry import setup_tracing

from ferry_delay_scheduler.api import build_app
from ferry_delay_scheduler.cancel import Canceller
from ferry_delay_scheduler.cancels import CancelBook
from ferry_delay_scheduler.config import ENV_PREFIX, SchedulerConfig
from ferry_delay_scheduler.leader import LeaderElection
from ferry_delay_scheduler.permissions import ROUTES
from ferry_delay_scheduler.stats import LATENESS_BOUNDS_MS, Stats
from ferry_delay_scheduler.term import Terms
from ferry_delay_scheduler.wheel import now_ms

log = logging.getLogger("ferry_delay_scheduler")

MINUTE_MS = 60_000
#: The service name of the scheduler's spans.
TRACE_SERVICE = "ferry-delay-scheduler"


class SchedulerApp(ServiceApp):
    """One scheduler instance: `await start()`, then `await stop()` (or `run()` for both)."""

    name = "delay scheduler"
    log = log

    def __init__(self, config: SchedulerConfig) -> None:
        super().__init__(HttpServer("delay-scheduler", ENV_PREFIX), config.http_port)
        self.config = config
        self.node_id = config.node_id
        self.stats = Stats()
        # FERRY_AUTH=on: the identities in etcd check every route (permissions.py).
        mesh = MeshClients.build("delay-scheduler", config, ROUTES, config.deliver_timeout_ms)
        self.credentials, self.pool, self.namesrv, self.auth = (
            mesh.credentials, mesh.pool, mesh.namesrv, mesh.auth)
        self.election: LeaderElection | None = None  # made once the HTTP port is bound
        self.cancels: CancelBook | None = None
        self.terms: Terms | None = None
        self._tasks: dict[str, asyncio.Task[None]] = {}

    # -- roles -----------------------------------------------------------------------

    def is_leader(self) -> bool:
        if not self.config.etcd:
            return True  # no etcd: a single instance, always leading
        return self.election is not None and self.election.is_leader

    def leads(self) -> bool:
        """The fence checked before each delivery (see leader.py)."""
        if not self.config.etcd:
            return True
        return self.election is not None and self.election.leads()

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
        self.cancels = CancelBook(None)
        self.terms = Terms(cfg, self.pool, self.namesrv, self.stats, self.cancels,
                           self.is_leader, self.leads)
        canceller = Canceller(lambda: self.terms.current if self.terms else None, self.cancels,
                              self.stats, self.is_leader, self.leader_addr, cfg.cancel_wait_ms,
                              cfg.deliver_timeout_ms)
        app = build_app(self.stats_document, lambda: self.ready, self.role, canceller,
                        package_version("ferry-delay-scheduler"),
                        auth=await start_service_auth(self.auth), guard=self.http.guard)
        self.stats.lateness.sink = app[METRICS].histogram(
            "ferry.scheduler.lateness", "s", "Delivery time - due time of delayed messages",
            tuple(b / 1000 for b in LATENESS_BOUNDS_MS))
        await self.serve_http(app, cfg.host)
        if cfg.etcd:
            http_addr = f"{cfg.advertise_host or cfg.host}:{self.port}"
            self.election = LeaderElection(cfg.etcd, cfg.etcd_prefix, self.node_id, http_addr,
                                           cfg.leader_ttl_s)
            self.cancels.registry = self.election.registry  # the cancel book lives in etcd
        loop = asyncio.get_running_loop()
        if self.election is not None:
            self._tasks["election"] = loop.create_task(self.election.run())
        self._tasks["terms"] = loop.create_task(self.terms.run())
        self._ready = True
        log.info("delay scheduler serving", extra={
            "node": self.node_id, "http": f"{cfg.host}:{self.port}", "data_dir": cfg.data_dir,
            "etcd": cfg.etcd or "-", "namesrv": cfg.namesrv})

    # -- statistics ------------------------------------------------------------------

    def stats_document(self) -> dict[str, Any]:
        term = self.terms.current if self.terms is not None else None
        s = self.stats
        now = now_ms()
        doc: dict[str, Any] = {
            "node_id": self.node_id, "role": self.role(),
            "leader": self.leader_addr(), "taken": s.taken, "delivered": s.delivered,
            "duplicates_after_crash": s.duplicates_after_crash, "cancelled": s.cancelled,
            "rolled": s.rolled, "delivery_errors": s.delivery_errors,
            "missing_records": s.missing_records, "lateness_ms": s.lateness.to_json(),
            "epoch": self.election.epoch if self.election is not None else 0,
            "terms": self.terms.terms if self.terms is not None else 0,
            "pulling_queues": term.ingestor.pulling if term else 0,
            "pinned": term.low.pinned if term else 0,
            "pending": 0, "due_next_minute": 0, "loaded": 0, "in_flight": 0, "torn_entries": 0,
        }
        if term is not None:
            wheel = term.wheel
            doc.update({"pending": wheel.pending, "due_next_minute": wheel.due_within(now, MINUTE_MS),
                        "loaded": wheel.loaded, "in_flight": wheel.inflight,
                        "torn_entries": wheel.torn_entries,
                        "closed_below_ms": wheel.closed_below * wheel.bucket_ms})
        doc["auth"] = auth_stats(self.auth.http if self.auth is not None else None)
        return doc

    # -- stop ------------------------------------------------------------------------

    async def stop_steps(self) -> None:
        await stop_step("stop the term loop", lambda: cancel_task(self._tasks, "terms"))
        if self.terms is not None:
            await stop_step("end the term", self.terms.stop)
        if self.election is not None:
            await stop_step("resign leadership", self.election.stop)
        await stop_step("stop background tasks", lambda: cancel_tasks(self._tasks))
        await stop_step("stop the HTTP API", self.http.stop)
        if self.auth is not None:
            await stop_step("stop the auth registry", self.auth.stop)
        await stop_step("close broker connections", self.pool.close)
        await stop_step("close the namesrv client", self.namesrv.close)
        await stop_step("stop tracing", stop_tracing)
