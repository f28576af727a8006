"""The disk alarm (hysteresis, logs, the error writes get) and the retention floor."""
from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from ferry.errors import DiskFullError
from ferry.store import RetentionFloor
from ferry_broker.config import BrokerConfig
from ferry_broker.consumer_offsets import ConsumerOffsetManager
from ferry_broker.disk import KEEP_ALL, DiskAlarm, floor_for_run, retention_floor
from ferry_broker.health import StoreHealth
from ferry_broker.put_pipeline import PutPipeline


def _alarm(tmp_path: Path, usage: list[float], now: list[float]) -> tuple[DiskAlarm, StoreHealth]:
    health = StoreHealth()
    cfg = BrokerConfig(data_dir=str(tmp_path), disk_high_water_ratio=0.9,
                       disk_low_water_ratio=0.8, disk_retention_ratio=0.75)
    return DiskAlarm(cfg, health, measure=lambda _p: usage[0], clock=lambda: now[0]), health


def test_alarm_hysteresis_and_rate_limited_logs(tmp_path: Path,
                                                caplog: pytest.LogCaptureFixture) -> None:
    usage, now = [0.5], [0.0]
    alarm, health = _alarm(tmp_path, usage, now)
    caplog.set_level(logging.INFO, logger="ferry_broker.disk")
    assert not alarm.check() and health.full is None
    usage[0] = 0.9  # at the mark counts
    assert alarm.check() and health.full is not None and "90.0 %" in health.full
    assert health.healthy  # readiness stays: the broker still serves reads
    usage[0] = 0.85  # under the high mark but not under the low one: still up
    for second in range(1, 180):  # three minutes in the alarm, checked every second
        now[0] = float(second)
        assert alarm.check()
    usage[0] = 0.79
    assert not alarm.check() and health.full is None
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 + 2 + 1, lines  # entering, a reminder a minute (60, 120), leaving
    assert lines[0].startswith("disk alarm:") and lines[-1].startswith("disk alarm cleared")
    assert alarm.as_json() == {"alarm": False, "used_ratio": 0.79, "high_water_ratio": 0.9,
                               "low_water_ratio": 0.8, "retention_ratio": 0.75,
                               "alarms_raised": 1, "held_by_floor": False}


def test_alarm_keeps_its_state_when_the_disk_cannot_be_measured(tmp_path: Path) -> None:
    def broken(_p: Path) -> float:
        raise OSError("gone")

    alarm = DiskAlarm(BrokerConfig(data_dir=str(tmp_path)), StoreHealth(), measure=broken)
    assert not alarm.check()


async def test_writes_are_refused_with_a_retriable_error_while_the_alarm_is_up(
        tmp_path: Path) -> None:
    usage, now = [0.95], [0.0]
    alarm, health = _alarm(tmp_path, usage, now)
    alarm.check()
    roles: Any = SimpleNamespace(writable=True)
    pipeline = PutPipeline(store=None, health=health, roles=roles, hooks=[])  # type: ignore[arg-type]
    with pytest.raises(DiskFullError) as err:
        await pipeline.put_messages(SimpleNamespace(messages=[]))  # type: ignore[arg-type]
    assert err.value.retriable and err.value.code == 30


def test_floor_only_under_pressure_and_none_when_forcing(tmp_path: Path) -> None:
    usage, now = [0.5], [0.0]
    alarm, _ = _alarm(tmp_path, usage, now)
    readers = RetentionFloor({("t", 0): 3})
    alarm.check()
    assert floor_for_run(alarm, False, lambda: readers) is KEEP_ALL
    assert floor_for_run(alarm, True, lambda: readers) is KEEP_ALL  # forcing: only under pressure
    usage[0] = 0.76  # past the retention ratio, under the high-water mark
    alarm.check()
    assert floor_for_run(alarm, False, lambda: readers) is readers
    assert floor_for_run(alarm, True, lambda: readers) is None


def test_retention_floor_is_the_smallest_offset_per_queue_and_slave(tmp_path: Path) -> None:
    offsets = ConsumerOffsetManager(tmp_path / "o.json")
    offsets.commit("g1", "t", 0, 10)
    offsets.commit("g2", "t", 0, 4)
    offsets.commit("g1", "t", 1, 7)
    offsets.commit("ferry-delay-scheduler", "%SCHEDULE%", 2, 5)
    no_slaves: Any = SimpleNamespace(server=None)
    floor = retention_floor(offsets, no_slaves)
    assert dict(floor.queue_positions) == {("t", 0): 4, ("t", 1): 7, ("%SCHEDULE%", 2): 5}
    assert floor.phy_offset is None
    slaves = SimpleNamespace(slaves=lambda: [{"acked_offset": 900}, {"acked_offset": 300}])
    with_slaves: Any = SimpleNamespace(server=slaves)
    assert retention_floor(offsets, with_slaves).phy_offset == 300


@pytest.mark.parametrize("ratios", [(0.8, 0.8, 0.9), (0.8, 0.85, 0.8), (0.9, 0.85, 0.95),
                                    (0.7, 0.8, 1.5), (0.0, 0.8, 0.9)])
def test_config_refuses_disordered_ratios(ratios: tuple[float, float, float]) -> None:
    retention, low, high = ratios
    if retention == low:  # equal retention and low marks are fine
        BrokerConfig(disk_retention_ratio=retention, disk_low_water_ratio=low,
                     disk_high_water_ratio=high)
        return
    with pytest.raises(ValueError):
        BrokerConfig(disk_retention_ratio=retention, disk_low_water_ratio=low,
                     disk_high_water_ratio=high)
