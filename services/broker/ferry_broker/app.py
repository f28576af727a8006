"""BrokerApp: builds the broker's components, starts them in order and stops them cleanly.

Start: open the store (recovering it if needed), load committed offsets and
the resets live members had not picked up,
listen on the wire port, start the HTTP API; then, in the background and
retrying until etcd answers, load topic config (RegistryCache), register in
etcd with the topics served and (replication async/sync) join the group's
election (roles.py). /readyz is 200 once registered. Stop (SIGTERM or
SIGINT): resign the election (a slave takes over at once), leave etcd so
that clients route elsewhere, stop accepting
connections and requests, answer parked pulls and in-flight requests, stop
HTTP, save the offsets, close the store (flush + clean-shutdown mark). Each
step runs even if an earlier one failed.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path

from ferry.auth.tls import server_context
from ferry.errors import FerryError
from ferry.service.app import ServiceApp
from ferry.service.http import HttpServer
from ferry.service.lifecycle import as_step, flush_tracing, stop_step, stop_tracing
from ferry.store import FlushMode, MessageStore, RetentionFloor, StoreConfig
from ferry.telemetry import setup_tracing

from ferry_broker.api import build_app
from ferry_broker.auth import BrokerAuth
from ferry_broker.config import ENV_PREFIX, BrokerConfig
from ferry_broker.consumer_offsets import ConsumerOffsetManager
from ferry_broker.consumers import ConsumerManager
from ferry_broker.context import BrokerContext
from ferry_broker.disk import floor_for_run, retention_floor
from ferry_broker.durability import DurabilityWaiter
from ferry_broker.handlers import HANDLERS
from ferry_broker.housekeeping import (
    FlushWatchdog,
    disk_loop,
    flush_watchdog_loop,
    retention_loop,
)
from ferry_broker.long_poll import LongPollManager
from ferry_broker.offset_resets import PendingResets
from ferry_broker.registration import Registration
from ferry_broker.server import BrokerServer
from ferry_broker.topics import TopicManager

#: The service name of the broker's spans (`service` in the span JSON).
TRACE_SERVICE = "ferry-broker"
log = logging.getLogger(__name__)

OFFSETS_FILE = Path("config") / "consumer_offsets.json"
RESETS_FILE = Path("config") / "pending_resets.json"   # offset_resets.py
CONSUMER_SWEEP_S = 5.0


def open_store(config: BrokerConfig) -> MessageStore:
    flush_mode = FlushMode.SYNC if config.flush_mode == "sync" else FlushMode.ASYNC
    return MessageStore(StoreConfig(
        root_dir=str(config.data_path), flush_mode=flush_mode,
        commitlog_segment_bytes=config.segment_bytes,
        sync_flush_timeout_ms=config.flush_timeout_ms, store_host=config.addr,
        flush_interval_ms=config.flush_interval_ms,
        checkpoint_interval_ms=config.checkpoint_interval_ms,
        max_message_bytes=config.max_message_bytes,
        retention_hours=config.retention_hours,
        # Deletions for the disk: from this ratio on, none past the floor (disk.py).
        disk_high_water_ratio=config.disk_retention_ratio,
    ))


class BrokerApp(ServiceApp):
    """The whole broker process."""

    name = "broker"
    log = log

    def __init__(self, config: BrokerConfig) -> None:
        # The HTTP API (0: none) is plain HTTP; TLS is on the wire and replication ports.
        super().__init__(HttpServer("broker", ENV_PREFIX, tls=False), config.http_port)
        self.config = config
        self.ctx: BrokerContext | None = None
        self.server: BrokerServer | None = None
        self.registration = Registration(config)
        #: Request verification (FERRY_AUTH=on); None when auth is off.
        self.auth: BrokerAuth | None = BrokerAuth(config) if config.auth else None
        self._tasks: list[asyncio.Task[None]] = []
        self._register_task: asyncio.Task[None] | None = None
        self._withdraw_task: asyncio.Task[None] | None = None
        self._started = False
        self._registered = False

    @property
    def ready(self) -> bool:
        """Serving, registered in etcd (when used), store healthy, not stopping."""
        return (self._started and self._registered and not self._stopping
                and self.ctx is not None and self.ctx.health.healthy
                and (self.auth is None or self.auth.loaded))

    async def start(self) -> None:
        """Open the store and serve; etcd registration goes on in the background."""
        cfg = self.config
        # Spans of traced messages only (the hooks check MessageFlag.TRACED first).
        setup_tracing(TRACE_SERVICE, namesrv=cfg.namesrv or None)
        cfg.data_path.mkdir(parents=True, exist_ok=True)
        store = open_store(cfg)
        offsets = ConsumerOffsetManager(cfg.data_path / OFFSETS_FILE, cfg.offsets_max_entries,
                                        cfg.offsets_max_per_identity)
        resets = PendingResets(path=cfg.data_path / RESETS_FILE)
        try:
            offsets.load()
            resets.load(lambda key: offsets.query(*key))
        except BaseException:
            store.close()
            raise
        topics = TopicManager(cfg, self.registration.prepare(),
                              self.auth.identity if self.auth is not None else None)
        self.ctx = BrokerContext(
            config=cfg, store=store, offsets=offsets,
            consumers=ConsumerManager(cfg.consumer_expiry_ms),
            long_poll=LongPollManager(cfg.max_held_pulls_per_conn, cfg.max_held_pulls),
            topics=topics, durability=DurabilityWaiter(cfg.flush_timeout_ms), auth=self.auth,
            resets=resets,
        )
        self.ctx.health.add_listener(self._on_store_failure)
        if store.commit_log_max_offset > 0:
            # It may have granted queue locks before it stopped, whose holders still
            # take messages for up to half an expiry: grant none meanwhile.
            self.ctx.locks.start_grace(cfg.lock_expiry_ms / 2)
        if self.auth is not None:
            await self.auth.start()
        self.server = BrokerServer(self.ctx, HANDLERS, self.auth)
        await self.server.start(cfg.host, cfg.port, server_context(cfg.tls_cert, cfg.tls_key))
        if cfg.http_port:
            await self.serve_http(build_app(self.ctx, lambda: self.ready, self.http.guard),
                                  cfg.host)
            log.info("HTTP API listening on %s:%d", cfg.host, self.port)
        loop = asyncio.get_running_loop()
        ctx, floor = self.ctx, self._retention_floor
        ctx.disk.check()  # disk pressure (disk.py): the alarm is right from the start
        self._tasks = [loop.create_task(self._save_offsets_loop()),
                       loop.create_task(retention_loop(ctx.disk, ctx.store,
                                                       cfg.retention_check_interval_ms, floor,
                                                       ctx.topics.retention)),
                       loop.create_task(disk_loop(ctx.disk, ctx.store,
                                                  cfg.disk_check_interval_ms, floor,
                                                  ctx.topics.retention)),
                       loop.create_task(self._expire_consumers_loop()),
                       loop.create_task(flush_watchdog_loop(
                           FlushWatchdog(self.ctx.store, self.ctx.health)))]
        self._register_task = loop.create_task(self._register(topics))
        self._started = True
        log.info("broker %s/%s/%d serving: wire %s, http %s, data %s, flush %s, replication %s, "
                 "auth %s", cfg.cluster, cfg.name, cfg.id, cfg.addr, cfg.http_addr or "-",
                 cfg.data_dir, cfg.flush_mode, cfg.replication, "on" if cfg.auth else "off")

    async def _register(self, topics: TopicManager) -> None:
        await self.registration.connect(topics)
        assert self.ctx is not None
        await self.ctx.roles.start(self.registration)
        self._registered = True
        log.info("broker ready")

    def _retention_floor(self) -> RetentionFloor | None:
        """What retention must keep this run (disk.py)."""
        ctx = self.ctx
        assert ctx is not None
        return floor_for_run(ctx.disk, self.config.disk_force_delete,
                             lambda: retention_floor(ctx.offsets, ctx.roles))

    def _on_store_failure(self) -> None:
        """The store refuses writes: leave etcd so that routes drop this broker."""
        if self._stopping:
            return
        if self._register_task is not None:
            self._register_task.cancel()
        self._withdraw_task = asyncio.get_running_loop().create_task(self._withdraw())

    async def _withdraw(self) -> None:
        """Leave the group's election (another member becomes master) and etcd."""
        if self.ctx is not None:
            await stop_step("resign the group's election", self.ctx.roles.stop)
        await self.registration.unregister()

    async def stop_steps(self) -> None:
        ctx = self.ctx
        await stop_step("stop registering", self._cancel_registration)
        # While this broker still serves: the trace topic may be stored here.
        await stop_step("flush spans", flush_tracing)
        if ctx is not None:
            # Resigning frees the election key at once: a slave takes over now, not
            # after a lease. Writes in flight get NotMasterError and are retried there.
            await stop_step("resign the group's election", ctx.roles.stop)
        await stop_step("leave etcd", self.registration.unregister)
        if self.server is not None and ctx is not None:
            await stop_step("drain requests", self._drain)
        await stop_step("stop background tasks", self._cancel_tasks)
        await stop_step("stop the HTTP API", self.http.stop)
        if ctx is not None:
            await stop_step("save consumer offsets", as_step(ctx.offsets.save))
            await stop_step("close the store", as_step(ctx.store.close))
        await stop_step("close the etcd client", self.registration.stop)
        if self.auth is not None:
            await stop_step("stop the auth registry", self.auth.stop)
        await stop_step("stop tracing", stop_tracing)

    async def _cancel_registration(self) -> None:
        for task in (self._register_task, self._withdraw_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    async def _drain(self) -> None:
        assert self.server is not None and self.ctx is not None
        self.server.stop_accepting()
        self.ctx.long_poll.close()
        await self.server.drain(self.config.shutdown_timeout_ms / 1000.0)

    async def _cancel_tasks(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _save_offsets_loop(self) -> None:
        assert self.ctx is not None
        offsets = self.ctx.offsets
        while True:
            await asyncio.sleep(self.config.offsets_flush_interval_ms / 1000.0)
            if offsets.dirty:
                # Snapshot on the loop (the table is only touched here), fsync off it.
                version, content = offsets.snapshot()
                try:
                    await asyncio.to_thread(offsets.write_snapshot, version, content)
                except (OSError, FerryError):
                    log.exception("could not save consumer offsets; will retry")

    async def _expire_consumers_loop(self) -> None:
        assert self.ctx is not None
        while True:
            await asyncio.sleep(CONSUMER_SWEEP_S)
            expired = self.ctx.consumers.expire()
            if expired:
                log.info("%d consumers expired without a heartbeat", expired)
            self.ctx.locks.purge_expired()
            expired = self.ctx.producers.expire()
            if expired:
                log.info("%d transactional producers expired without a heartbeat", expired)

