"""Disk pressure: the high-water alarm that refuses writes, and the retention floor.

The broker measures the filesystem of its data directory every
`disk_check_interval_ms`. At `disk_high_water_ratio` or above it raises the
alarm: every write (SEND, SEND_BACK, DELIVER_DUE, END_TRANSACTION) is answered
with DiskFullError (retriable: producers send to another broker), `/v1/stats`
shows `disk.alarm`, and the log says so once on entering, once on leaving and at
most once a minute in between. Writes resume by themselves once usage falls
below `disk_low_water_ratio` (hysteresis: no flapping at the mark). Reads,
offset commits and replication go on: consumers reading is what frees space.

From `disk_retention_ratio` on (below the high-water mark: space is freed before
writes stop), retention deletes segments that have not expired, the oldest
first, until usage is below that ratio, but only those every reader has passed: the retention floor is the smallest phy
offset of the first unread record of any (group, topic, queue) with a committed
offset (consumer groups, the delay scheduler's `%SCHEDULE%` group, the
txn-checker's `%HALF%`/`%OP%` groups, retry topics alike) and of what a
connected slave has not acknowledged. `disk_force_delete` (off by default)
brings back the old rule: the oldest segments go whatever was read. The floor
is computed only when the last check found usage at or past the ratio.
Age-based retention (`retention_hours`) ignores the floor, as in Kafka and RocketMQ.
"""
from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ferry.store import RetentionFloor

from ferry_broker.health import StoreHealth

if TYPE_CHECKING:
    from ferry_broker.config import BrokerConfig
    from ferry_broker.consumer_offsets import ConsumerOffsetManager
    from ferry_broker.roles import RoleManager

log = logging.getLogger(__name__)

#: While the alarm is up, a reminder is logged at most this often.
REMIND_EVERY_S = 60.0
#: The floor that protects everything: disk pressure deletes nothing.
KEEP_ALL = RetentionFloor(phy_offset=0)


def used_ratio(path: Path) -> float:
    """The used fraction of the filesystem holding `path`."""
    usage = shutil.disk_usage(path)
    return usage.used / usage.total if usage.total else 0.0


class DiskAlarm:
    """The high/low-water alarm over the data directory's filesystem."""

    def __init__(self, config: BrokerConfig, health: StoreHealth,
                 measure: Callable[[Path], float] = used_ratio,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._path = config.data_path
        self.retention = config.disk_retention_ratio
        self.high = config.disk_high_water_ratio
        self.low = config.disk_low_water_ratio
        self._health, self._measure, self._clock = health, measure, clock
        self.used_ratio = 0.0
        self.alarm = False
        self.raised = 0  # times the alarm went up since start
        # The last retention run wanted to free space and the floor kept it: the disk
        # is full of what readers have not passed (set by housekeeping).
        self.held_by_floor = False
        self._reminded = 0.0

    def check(self) -> bool:
        """Measure now and move the alarm; whether it is up."""
        try:
            ratio = self._measure(self._path)
        except OSError as exc:
            log.warning("cannot measure the data directory's disk: %s", exc)
            return self.alarm
        self.update(ratio)
        return self.alarm

    def update(self, ratio: float) -> None:
        self.used_ratio = ratio
        now = self._clock()
        if not self.alarm and ratio >= self.high:
            self.alarm, self._reminded = True, now
            self.raised += 1
            log.error("disk alarm: the data directory's disk is %.1f %% full (high-water mark "
                      "%.1f %%); refusing writes with DiskFullError until below %.1f %%",
                      100 * ratio, 100 * self.high, 100 * self.low, extra=self._fields())
        elif self.alarm and ratio < self.low:
            self.alarm = False
            log.warning("disk alarm cleared: %.1f %% full (below the low-water mark %.1f %%); "
                        "taking writes again", 100 * ratio, 100 * self.low,
                        extra=self._fields())
        elif self.alarm and now - self._reminded >= REMIND_EVERY_S:
            self._reminded = now
            log.error("disk alarm still up: %.1f %% full; writes refused", 100 * ratio,
                      extra=self._fields())
        self._health.full = self.message() if self.alarm else None

    def message(self) -> str:
        return (f"this broker's disk is {100 * self.used_ratio:.1f} % full (high-water mark "
                f"{100 * self.high:.1f} %): no writes until below {100 * self.low:.1f} %; "
                "send to another broker or retry later")

    def _fields(self) -> dict[str, Any]:
        return {"used_ratio": round(self.used_ratio, 4), "high_water_ratio": self.high,
                "low_water_ratio": self.low, "retention_ratio": self.retention}

    def as_json(self) -> dict[str, Any]:
        """The `disk` section of /v1/stats."""
        return {"alarm": self.alarm, **self._fields(), "alarms_raised": self.raised,
                "held_by_floor": self.held_by_floor}


def retention_floor(offsets: ConsumerOffsetManager, roles: RoleManager) -> RetentionFloor:
    """What disk pressure must keep: every group's first unread record, every connected
    slave's first unacknowledged byte."""
    server = roles.server
    acked = [s["acked_offset"] for s in server.slaves()] if server is not None else []
    return RetentionFloor(offsets.queue_floors(), min(acked) if acked else None)


def floor_for_run(alarm: DiskAlarm, force: bool,
                  floor: Callable[[], RetentionFloor]) -> RetentionFloor | None:
    """The floor to run retention with: everything kept while the last check found the
    disk below `disk_retention_ratio` (no deletions for the disk then); else the
    readers' floor, or none at all with `disk_force_delete` (the old rule)."""
    if alarm.used_ratio < alarm.retention:
        return KEEP_ALL
    return None if force else floor()
