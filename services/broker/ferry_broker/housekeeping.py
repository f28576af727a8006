"""Periodic store housekeeping: retention of old commit-log segments, and a flush watchdog.

The store deletes whole segments older than `retention_hours`, and from
`disk_retention_ratio` on (disk.py) the oldest ones that every reader has
passed even if not expired; consume queues and index files follow (see docs/store-format.md).
A topic's own retention (`retention_ms`, `retention_bytes` in its etcd config) trims
its queues and holds shared segments (ferry/store/topic_retention.py, docs/broker.md).
The broker runs it every `retention_check_interval_ms` on its event loop, where
all store writes happen (a run unlinks files and moves minimum offsets, which is
quick), and after every disk check that finds the alarm up.

The flush watchdog notices a commit log whose flushed offset stays behind its
write offset without moving for `FLUSH_STALL_MS` (the store's flush thread
died after an I/O error, or hangs in fdatasync): the broker then refuses
SENDs (StoreUnavailableError, retriable) and /readyz answers 503, until
flushing moves again. In async flush mode nothing else would notice, and
every acknowledgement would promise a durability that never comes.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from typing import Protocol

from ferry.errors import FerryError
from ferry.store import MessageStore, RetentionFloor, TopicRetention

from ferry_broker.disk import DiskAlarm
from ferry_broker.health import StoreHealth

log = logging.getLogger(__name__)

FLUSH_STALL_MS = 30_000
FLUSH_CHECK_INTERVAL_MS = 1_000


class FlushPositions(Protocol):
    """What the watchdog reads of the store."""

    @property
    def flushed_offset(self) -> int: ...

    @property
    def commit_log_max_offset(self) -> int: ...

    @property
    def failure(self) -> BaseException | None: ...


class FlushWatchdog:
    """Marks the store stalled while its flushed offset lags and does not move."""

    def __init__(self, store: FlushPositions, health: StoreHealth,
                 stall_ms: int = FLUSH_STALL_MS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._store = store
        self._health = health
        self._stall_s = stall_ms / 1000.0
        self._clock = clock
        self._last_flushed = -1
        self._since = clock()

    def check(self) -> None:
        failure = self._store.failure
        if failure is not None and self._health.failure is None:
            # A failure the store saw on its own (the flush thread died, a dispatch
            # failed) leaves readiness now, not at the next refused SEND.
            self._health.unavailable(failure)
        flushed, written = self._store.flushed_offset, self._store.commit_log_max_offset
        now = self._clock()
        if flushed >= written or flushed != self._last_flushed:
            self._last_flushed, self._since = flushed, now
            if self._health.stalled is not None:
                self._health.set_stalled(None)
            return
        if now - self._since >= self._stall_s and self._health.stalled is None:
            self._health.set_stalled(f"commit log not flushed for {now - self._since:.0f} s, "
                                     f"{written - flushed} bytes behind")


async def flush_watchdog_loop(watchdog: FlushWatchdog,
                              interval_ms: int = FLUSH_CHECK_INTERVAL_MS) -> None:
    """Check the flush progress every `interval_ms` until cancelled."""
    while True:
        await asyncio.sleep(interval_ms / 1000)
        watchdog.check()


FloorFn = Callable[[], RetentionFloor | None]
#: Per-topic retention (TopicManager.retention); None while the topic config is not loaded.
TopicsFn = Callable[[], Mapping[str, TopicRetention] | None]


def run_retention_once(store: MessageStore, topics: TopicsFn,
                       floor: RetentionFloor | None = None, alarm: DiskAlarm | None = None) -> None:
    """One retention pass; failures are logged, never raised (the broker keeps serving).

    `alarm` learns whether the floor kept segments the disk wanted gone (/v1/stats).
    No pass runs before the topic config is loaded: a topic keeping its records
    longer than the broker could lose them to the broker's default."""
    retention = topics()
    if retention is None:
        log.info("retention waits for the topic config")
        return
    try:
        report = store.run_retention(floor=floor, topics=retention)
    except (FerryError, OSError) as exc:
        log.warning("retention run failed: %s", exc, extra={"error": type(exc).__name__})
        return
    if alarm is not None:
        alarm.held_by_floor = report.held_by_floor
    if report.deleted_segments:
        log.info("retention deleted %d commit-log segment(s)", report.deleted_segments,
                 extra={"freed_bytes": report.freed_bytes,
                        "forced_by_disk": report.forced_by_disk,
                        "new_min_phy_offset": report.new_min_phy_offset})


async def retention_loop(alarm: DiskAlarm, store: MessageStore, interval_ms: int,
                         floor: FloorFn, topics: TopicsFn) -> None:
    """Run retention every `interval_ms`, with the floor `floor()` gives, until cancelled."""
    while True:
        await asyncio.sleep(interval_ms / 1000)
        run_retention_once(store, topics, floor(), alarm)


async def disk_loop(alarm: DiskAlarm, store: MessageStore, interval_ms: int,
                    floor: FloorFn, topics: TopicsFn) -> None:
    """Check the disk every `interval_ms`; while the alarm is up, run retention each time."""
    while True:
        await asyncio.sleep(interval_ms / 1000)
        if alarm.check():
            run_retention_once(store, topics, floor(), alarm)
