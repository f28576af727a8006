"""CheckerApp: builds the txn-checker's parts, restores its checkpoint, runs them, stops cleanly.

Start: load the checkpoint into the book, serve HTTP, then join the election
(leading.py: while this instance leads, the scanner, the check loop and the
commits of the low-water marks run) and run the checkpoint saver. Stop
(SIGTERM or SIGINT): end the term (stop scanning, let the checks under way
finish, bounded by `shutdown_timeout_ms`), save the checkpoint, commit the
marks and resign, stop HTTP, close connections. Each step runs even if an
earlier one failed.
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from ferry.service.app import ServiceApp
from ferry.service.auth import auth_stats, start_service_auth
from ferry.service.http import HttpServer
from ferry.service.lifecycle import (
    cancel_tasks,
    package_version,
    stop_step,
    stop_tracing,
)
from ferry.service.mesh import MeshClients
from ferry.telemetry import setup_tracing

from ferry_txn_checker import checkpoint
from ferry_txn_checker.api import build_app
from ferry_txn_checker.config import ENV_PREFIX, CheckerConfig
from ferry_txn_checker.leading import Leadership
from ferry_txn_checker.permissions import ROUTES
from ferry_txn_checker.state import Book

log = logging.getLogger("ferry_txn_checker")

#: The service name of the checker's spans.
TRACE_SERVICE = "ferry-txn-checker"
CHECKPOINT_DUTY_FACTOR = 10  # the pause after a save is at least 10x its duration


class CheckerApp(ServiceApp):
    """One txn-checker: `await start()`, then `await stop()` (or `run()` for both)."""

    name = "txn-checker"
    log = log

    def __init__(self, config: CheckerConfig) -> None:
        super().__init__(HttpServer("txn-checker", ENV_PREFIX), config.http_port)
        self.config = config
        # FERRY_AUTH=on: the identities in etcd check every route (permissions.py).
        mesh = MeshClients.build("txn-checker", config, ROUTES, config.check_timeout_ms)
        self.credentials, self.pool, self.namesrv, self.auth = (
            mesh.credentials, mesh.pool, mesh.namesrv, mesh.auth)
        self.node_id = config.node_id
        self.book = Book(default_immunity_ms=config.check_immunity_ms,
                         max_open=config.max_open, max_discarded=config.max_discarded,
                         max_recent=config.max_recent,
                         check_interval_ms=config.check_interval_ms,
                         max_checks=config.max_checks)
        # Only the elected instance scans and checks (leading.py).
        self.leadership = Leadership(config, self.book, self.pool, self.namesrv, self.node_id)
        self._tasks: dict[str, asyncio.Task[None]] = {}

    async def start(self) -> None:
        cfg = self.config
        setup_tracing(TRACE_SERVICE, namesrv=cfg.namesrv)  # check spans of traced halves
        cfg.data_path.mkdir(parents=True, exist_ok=True)
        doc = checkpoint.load(cfg.data_path)
        if doc is not None:
            self.book.restore(doc)
            self.leadership.book_epoch = int(doc.get("epoch", 0))
        log.info("txn-checker starting", extra={
            "node_id": self.node_id, "open": self.book.open_count,
            "brokers": sorted(self.book.brokers), "restored": doc is not None})
        app = build_app(self.book, self.stats_document, lambda: self.ready,
                        package_version("ferry-txn-checker"),
                        auth=await start_service_auth(self.auth), guard=self.http.guard)
        await self.serve_http(app, cfg.host)
        await self.leadership.start(f"{cfg.host}:{self.port}")
        self._tasks["checkpoint"] = asyncio.create_task(self._checkpoint_loop(),
                                                        name="checkpoint")
        self._ready = True
        log.info("txn-checker ready", extra={"http_port": self.port})

    # -- checkpoint ------------------------------------------------------------------

    async def save_checkpoint(self) -> None:
        """Snapshot the book (in this loop turn) and write it off the loop."""
        self.book.dirty = False
        payload = checkpoint.encode(self.book.snapshot(), self.leadership.book_epoch)
        await asyncio.to_thread(checkpoint.save, self.config.data_path, payload)

    async def _checkpoint_loop(self) -> None:
        pause_s = self.config.checkpoint_interval_ms / 1000
        while True:
            await asyncio.sleep(pause_s)
            try:
                if self.book.dirty:
                    started = time.monotonic()
                    await self.save_checkpoint()
                    # A large open set makes a save slow (its JSON is built on the loop):
                    # saves then take at most 1/CHECKPOINT_DUTY_FACTOR of the time.
                    pause_s = max(self.config.checkpoint_interval_ms / 1000,
                                  (time.monotonic() - started) * CHECKPOINT_DUTY_FACTOR)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("saving the checkpoint failed; will retry")

    # -- statistics ------------------------------------------------------------------

    def stats_document(self) -> dict[str, Any]:
        book = self.book
        doc: dict[str, Any] = {"node_id": self.node_id, "open": book.open_count,
                               **book.counters, "discarded_listed": len(book.discarded),
                               "scanning": self.leadership.scanner.pulling,
                               "checks_in_flight": self.leadership.checker.in_flight,
                               **self.leadership.describe()}
        doc["brokers"] = {name: {"half_next": s.half_next, "op_next": s.op_next,
                                 "open": len(s.open), "early_ops": len(s.early_ops),
                                 "half_low": s.half_low, "op_synced_ms": s.op_synced_ms}
                          for name, s in book.brokers.items()}
        doc["auth"] = auth_stats(self.auth.http if self.auth is not None else None)
        return doc

    # -- stop ------------------------------------------------------------------------

    async def stop_steps(self) -> None:
        await stop_step("stop scanning and checking", lambda: self.leadership.stop_term(
            self.config.shutdown_timeout_ms / 1000))
        await stop_step("stop background tasks", lambda: cancel_tasks(self._tasks))
        if self._ready:
            await stop_step("save the checkpoint", self.save_checkpoint)
        await stop_step("commit the marks and resign", self.leadership.close)
        await stop_step("stop the HTTP API", self.http.stop)
        if self.auth is not None:
            await stop_step("stop the auth registry", self.auth.stop)
        await stop_step("close broker connections", self.pool.close)
        await stop_step("close the namesrv client", self.namesrv.close)
        await stop_step("stop tracing", stop_tracing)
