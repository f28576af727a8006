"""Disk-pressure retention with a protected floor: what a reader has not passed stays."""
from __future__ import annotations

from pathlib import Path

from ferry.store import MessageIn, MessageStore, RetentionFloor, StoreConfig
from ferry.store.retention import SegmentInfo, plan_retention
from hypothesis import given
from hypothesis import strategies as st

from tests.store.test_retention import HOUR_MS, NOW, SEG, segs


def plan(segments: list[SegmentInfo], floor: int | None, *, used: float = 0.99,
         total: int | None = 10 * SEG, retention_h: int = 72):
    return plan_retention(segments, now_ms=NOW, retention_ms=retention_h * HOUR_MS,
                          disk_used_ratio=used, high_water_ratio=0.75, disk_total_bytes=total,
                          protected_from=floor)


def starts(p) -> list[int]:  # type: ignore[no-untyped-def]
    return [s.start_offset // SEG for s in p.segments]


def test_disk_pressure_stops_at_the_floor() -> None:
    # Unprotected, 0.99 needs three segments gone (-> 0.69); a reader at 1500 keeps
    # segment 1 (it holds 1500) and everything after it.
    assert starts(plan(segs([5, 4, 3, 2, 1]), None)) == [0, 1, 2]
    p = plan(segs([5, 4, 3, 2, 1]), 1500)
    assert starts(p) == [0] and p.held_by_floor and p.forced_by_disk == 1
    # A floor at a segment's end: that segment is wholly passed and may go.
    assert starts(plan(segs([5, 4, 3, 2, 1]), 2000)) == [0, 1]
    assert starts(plan(segs([5, 4, 3, 2, 1]), 3000)) == [0, 1, 2]
    # A floor at the start of the log: nothing goes for the disk.
    p = plan(segs([5, 4, 3, 2, 1]), 0)
    assert starts(p) == [] and p.held_by_floor


def test_one_per_call_without_total_respects_the_floor() -> None:
    assert starts(plan(segs([5, 4, 3]), 500, total=None)) == []
    assert starts(plan(segs([5, 4, 3]), 1000, total=None)) == [0]


def test_no_pressure_is_not_held() -> None:
    p = plan(segs([5, 4, 3]), 0, used=0.1)
    assert starts(p) == [] and not p.held_by_floor


def test_age_ignores_the_floor() -> None:
    # Expired segments go whatever the readers (Kafka's and RocketMQ's rule too).
    p = plan(segs([90, 80, 1]), 0, used=0.1)
    assert starts(p) == [0, 1] and p.expired == 2


@given(ages=st.lists(st.integers(0, 200), max_size=10), floor=st.integers(0, 12 * SEG),
       used=st.floats(0.0, 1.0), with_total=st.booleans())
def test_property_disk_never_crosses_the_floor(ages: list[int], floor: int, used: float,
                                               with_total: bool) -> None:
    p = plan(segs(ages), floor, used=used, total=10 * SEG if with_total else None)
    for seg in p.segments[p.expired:]:
        assert seg.end_offset <= floor


STORE = dict(commitlog_segment_bytes=256 * 1024, max_message_bytes=16 * 1024,
             cq_entries_per_segment=50, index_max_slots=1024, index_max_entries=4096,
             retention_hours=1000)


def _filled(tmp_path: Path, usage: float) -> MessageStore:
    store = MessageStore(StoreConfig(root_dir=str(tmp_path), disk_usage_fn=lambda _r: usage,
                                     **STORE))  # type: ignore[arg-type]
    for i in range(120):  # about 6 segments over two queues
        store.put(MessageIn("t", i % 2, b"x" * 12_000, keys=f"k{i}"))
    return store


def test_store_keeps_what_a_queue_position_protects(tmp_path: Path) -> None:
    with _filled(tmp_path, 0.99) as s:
        assert len(s._cl.segments) >= 5
        # A reader of queue 1 at offset 0 protects the very first records.
        for _ in range(3):
            report = s.run_retention(floor=RetentionFloor({("t", 1): 0}))
            assert report.deleted_segments == 0 and report.held_by_floor
        assert s.get_messages("t", 1, 0).records
        # Queue 1 read to offset 30 (phy of its 31st record); queue 0 fully read.
        phy = s.get_messages("t", 1, 30, 1).records
        floor = RetentionFloor({("t", 1): 30, ("t", 0): s.max_offset("t", 0)})
        for _ in range(10):
            s.run_retention(floor=floor)
        assert s.commit_log_min_offset > 0
        got = s.get_messages("t", 1, 30)
        assert got.records and got.records == phy + got.records[1:]
        # Unknown queues and positions past a queue's end protect nothing.
        s.run_retention(floor=RetentionFloor({("gone", 0): 0, ("t", 1): 10**9}))


def test_store_keeps_what_a_phy_position_protects(tmp_path: Path) -> None:
    with _filled(tmp_path, 0.99) as s:
        for _ in range(10):
            s.run_retention(floor=RetentionFloor(phy_offset=300 * 1024))
        assert s.commit_log_min_offset == 256 * 1024  # the segment holding 300 KiB stays


def test_store_without_floor_deletes_for_the_disk(tmp_path: Path) -> None:
    with _filled(tmp_path, 0.99) as s:
        report = s.run_retention()
        assert report.deleted_segments == 1 and report.forced_by_disk == 1
