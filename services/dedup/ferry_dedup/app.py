"""DedupApp: builds the dedup service's parts, serves its HTTP API, reconciles on a schedule.

Start: open the reports directory, create the ledger schema (if the database
is away this is logged and retried by every later call: the service still
serves claims), serve HTTP, start the schedule. Stop (SIGTERM or SIGINT):
stop the schedule (a reconciliation under way is cancelled; it had saved
nothing), stop HTTP, close Redis, broker and namesrv connections. Redis or
the database being away fails only the calls that need them (503).
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections import Counter
from typing import Any

from ferry.client.core.namesrv import RouteCache
from ferry.errors import FerryError
from ferry.service.app import ServiceApp
from ferry.service.auth import auth_stats, start_service_auth
from ferry.service.http import HttpServer
from ferry.service.lifecycle import cancel_tasks, package_version, stop_step, stop_tracing
from ferry.service.mesh import MeshClients
from ferry.telemetry import setup_tracing

from ferry_dedup.api import build_app
from ferry_dedup.claims import Claims
from ferry_dedup.config import ENV_PREFIX, DedupConfig, ReconcileTarget
from ferry_dedup.ledger_store import LedgerStore
from ferry_dedup.permissions import ROUTES
from ferry_dedup.reconcile import Reconciler, ReconcileRequest, now_ms
from ferry_dedup.reports import ReportStore
from ferry_dedup.stored import StoredReader

log = logging.getLogger("ferry_dedup")
#: The service name of the dedup service's spans.
TRACE_SERVICE = "ferry-dedup"

Json = dict[str, Any]


class DedupApp(ServiceApp):
    """One dedup service: `await start()`, then `await stop()` (or `run()` for both)."""

    name = "dedup"
    log = log

    def __init__(self, config: DedupConfig) -> None:
        super().__init__(HttpServer("dedup", ENV_PREFIX), config.http_port)
        self.config = config
        self.version = package_version("ferry-dedup")
        self.claims = Claims(config.redis, lease_ms=config.claim_lease_ms,
                             done_ttl_ms=config.claim_done_ttl_ms)
        self.ledger = LedgerStore(config.ledger, config.ledger_table, config.db_timeout_ms)
        # FERRY_AUTH=on: the identities in etcd check every route (permissions.py).
        mesh = MeshClients.build("dedup", config, ROUTES, config.request_timeout_ms)
        self.credentials, self.pool, self.namesrv, self.auth = (
            mesh.credentials, mesh.pool, mesh.namesrv, mesh.auth)
        self.reader = StoredReader(self.pool, RouteCache(self.namesrv, refresh_interval_ms=0),
                                   pull_max_count=config.pull_max_count,
                                   max_messages=config.max_scan_messages)
        self.reconciler = Reconciler(config, self.reader, self.ledger)
        self.store = ReportStore(config.data_path / "reports", config.max_reports)
        # One reconciliation at a time: each reads a whole window from the brokers.
        self._reconciling = asyncio.Lock()
        self.lookups: Counter[str] = Counter()
        self.reconciliations: Counter[str] = Counter()
        self.last_report: Json | None = None
        self._tasks: dict[str, asyncio.Task[None]] = {}

    async def start(self) -> None:
        cfg = self.config
        setup_tracing(TRACE_SERVICE, namesrv=cfg.namesrv)  # spans of traced claim requests
        cfg.data_path.mkdir(parents=True, exist_ok=True)
        self.store.open()
        try:
            await self.ledger.create_schema()
        except FerryError as exc:
            log.warning("ledger schema not created now (%s); look-ups retry the database", exc)
        latest, _ = self.store.list(1)
        self.last_report = latest[0] if latest else None
        await self.namesrv.start()
        app = build_app(self, auth=await start_service_auth(self.auth), guard=self.http.guard)
        await self.serve_http(app, cfg.host)
        if cfg.targets:
            self._tasks["schedule"] = asyncio.create_task(self._schedule(), name="schedule")
        self._ready = True
        log.info("dedup ready", extra={"http_port": self.port, "ledger": self.ledger.dialect,
                                       "scheduled": [dataclasses.asdict(t)
                                                     for t in cfg.targets]})

    # -- the API's backend ----------------------------------------------------------------
    async def claim(self, body: Any) -> Json:
        return await self.claims.acquire(body)

    async def finish_claim(self, body: Any, *, confirm: bool) -> Json:
        return await self.claims.finish(body, confirm=confirm)

    async def lookup_biz_key(self, scene: str, biz_key: str) -> Json | None:
        self.lookups["by_biz_key"] += 1
        row = await self.ledger.by_biz_key(scene, biz_key)
        self.lookups["found" if row is not None else "not_found"] += 1
        return dataclasses.asdict(row) if row is not None else None

    async def lookup_msg_id(self, msg_id: str) -> list[Json]:
        self.lookups["by_msg_id"] += 1
        rows = await self.ledger.by_msg_id(msg_id)
        self.lookups["found" if rows else "not_found"] += 1
        return [dataclasses.asdict(r) for r in rows]

    async def reconcile(self, body: Any) -> Json:
        return await self.run_reconcile(ReconcileRequest.from_json(body, self.config, now_ms()))

    async def run_reconcile(self, req: ReconcileRequest) -> Json:
        """Run one reconciliation, keep its report, count it; failures are counted and raised."""
        async with self._reconciling:
            try:
                report = await self.reconciler.run(req)
                await asyncio.to_thread(self.store.save, report)
            except Exception:
                self.reconciliations["failed"] += 1
                raise
        self.reconciliations["run"] += 1
        self.reconciliations[req.trigger] += 1
        self.last_report = {k: v for k, v in report.items() if k != "samples"}
        log.info("reconciled", extra={"report": report["id"], "topic": req.topic,
                                      "group": req.group, "counts": report["counts"]})
        return report

    def reports(self, limit: int) -> tuple[list[Json], int]:
        return self.store.list(limit)

    def report(self, report_id: str) -> Json | None:
        return self.store.get(report_id)

    def stats_document(self) -> Json:
        last = self.last_report
        return {"claims": self.claims.stats(), "lookups": dict(self.lookups),
                "reconciliations": dict(self.reconciliations),
                "last_report": None if last is None else {
                    k: last.get(k) for k in ("id", "trigger", "topic", "group", "scene",
                                             "from_ms", "to_ms", "finished_ms", "complete",
                                             "counts")},
                "ledger": self.ledger.dialect,
                "scheduled": [dataclasses.asdict(t) for t in self.config.targets],
                "auth": auth_stats(self.auth.http if self.auth is not None else None)}

    async def health(self) -> tuple[bool, Json]:
        doc: Json = {}
        for name, ping in (("redis", self.claims.ping), ("ledger", self.ledger.ping)):
            try:
                await ping()
                doc[name] = {"ok": True}
            except FerryError as exc:
                doc[name] = {"ok": False, "error": str(exc)}
        ok = all(part["ok"] for part in doc.values())
        return ok, {"status": "ok" if ok else "degraded", **doc}

    # -- the schedule -------------------------------------------------------------------
    async def _schedule(self) -> None:
        interval_s = self.config.reconcile_interval_s
        while True:
            await asyncio.sleep(interval_s)
            to = now_ms()
            for target in self.config.targets:
                await self._scheduled_one(target, to)

    async def _scheduled_one(self, target: ReconcileTarget, to_ms: int) -> None:
        req = ReconcileRequest(target.topic, target.group, target.scene,
                               to_ms - self.config.reconcile_window_ms, to_ms,
                               self.config.grace_ms, trigger="schedule")
        try:
            await self.run_reconcile(req)
        except asyncio.CancelledError:
            raise
        except Exception as exc:   # logged, counted; the next round tries again
            log.warning("scheduled reconciliation of %s:%s failed: %s", target.topic,
                        target.group, exc)

    # -- stop ---------------------------------------------------------------------------
    async def stop_steps(self) -> None:
        await stop_step("stop the schedule", lambda: cancel_tasks(self._tasks))
        await stop_step("stop the HTTP API", self.http.stop)
        if self.auth is not None:
            await stop_step("stop the auth registry", self.auth.stop)
        await stop_step("close Redis", self.claims.close)
        await stop_step("close broker connections", self.pool.close)
        await stop_step("close the namesrv client", self.namesrv.close)
        await stop_step("stop tracing", stop_tracing)
