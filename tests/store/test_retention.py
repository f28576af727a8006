"""Retention policy: by age, by disk watermark, never the active segment, oldest first."""
from __future__ import annotations

import pytest
from ferry.errors import StoreError
from ferry.store.retention import RetentionReport, SegmentInfo, plan_retention
from hypothesis import given
from hypothesis import strategies as st

SEG = 1000
HOUR_MS = 3_600_000
NOW = 100 * HOUR_MS


def segs(ages_h: list[int]) -> list[SegmentInfo]:
    """Segments oldest first, each SEG bytes, last modified `age` hours before NOW."""
    return [SegmentInfo(f"/log/{i * SEG:020d}", i * SEG, (i + 1) * SEG, NOW - a * HOUR_MS)
            for i, a in enumerate(ages_h)]


def delete(segments: list[SegmentInfo], *, retention_h: int = 72, used: float = 0.1,
           high: float = 0.85, total: int | None = None) -> list[int]:
    got = plan_retention(segments, now_ms=NOW, retention_ms=retention_h * HOUR_MS,
                         disk_used_ratio=used, high_water_ratio=high, disk_total_bytes=total).segments
    return [s.start_offset // SEG for s in got]


def test_nothing_to_delete() -> None:
    assert delete([]) == []
    assert delete(segs([100])) == []  # the only, active, segment is never deleted
    assert delete(segs([10, 5, 1])) == []


def test_by_age_oldest_first_never_active() -> None:
    assert delete(segs([90, 80, 73, 72, 71, 1])) == [0, 1, 2, 3]  # 72 h old is expired
    assert delete(segs([90, 80, 75])) == [0, 1]


def test_input_order_does_not_matter() -> None:
    assert delete(list(reversed(segs([90, 80, 10, 1])))) == [0, 1]


def test_age_stops_at_first_young_segment() -> None:
    # A younger segment in the middle (e.g. touched by a copy) keeps the later ones:
    # the log must stay contiguous.
    assert delete(segs([90, 10, 80, 1])) == [0]


def test_negative_retention_disables_age() -> None:
    assert delete(segs([900, 800, 1]), retention_h=-1) == []


def test_disk_pressure_one_per_call_without_total() -> None:
    assert delete(segs([5, 4, 3, 2, 1]), used=0.9) == [0]
    assert delete(segs([5, 4, 3, 2, 1]), used=0.85) == [0]  # at the mark counts
    assert delete(segs([80, 79, 3, 2, 1]), used=0.9) == [0, 1, 2]  # expired + one more
    assert delete(segs([5]), used=0.99) == []


def test_disk_pressure_as_many_as_needed_with_total() -> None:
    total = 10 * SEG  # each segment is 10% of the disk
    assert delete(segs([5, 4, 3, 2, 1]), used=0.9, total=total) == [0]  # -> 0.8
    assert delete(segs([5, 4, 3, 2, 1]), used=0.96, high=0.8, total=total) == [0, 1]  # -> 0.76
    # Expired deletions count first: 2 expired bring 0.95 to 0.75, under 0.8.
    assert delete(segs([80, 79, 3, 2, 1]), used=0.95, high=0.8, total=total) == [0, 1]
    # Never the active segment, however full the disk.
    assert delete(segs([3, 2, 1]), used=1.0, high=0.5, total=total) == [0, 1]


def test_plan_counts_reasons() -> None:
    plan = plan_retention(segs([80, 79, 3, 2, 1]), now_ms=NOW, retention_ms=72 * HOUR_MS,
                          disk_used_ratio=0.95, high_water_ratio=0.85, disk_total_bytes=10 * SEG)
    assert (plan.expired, plan.forced_by_disk, len(plan.segments)) == (2, 0, 2)
    plan = plan_retention(segs([80, 79, 3, 2, 1]), now_ms=NOW, retention_ms=72 * HOUR_MS,
                          disk_used_ratio=0.99, high_water_ratio=0.75, disk_total_bytes=10 * SEG)
    assert (plan.expired, plan.forced_by_disk) == (2, 1)  # 0.99 -> 0.79 -> 0.69


def test_bad_arguments() -> None:
    with pytest.raises(StoreError):
        delete(segs([1, 2]), high=0.0)
    with pytest.raises(StoreError):
        delete(segs([1, 2]), used=1.5)
    with pytest.raises(StoreError):
        delete(segs([1, 2]), total=0)


def test_report() -> None:
    report = RetentionReport(deleted_segments=2, new_min_phy_offset=2 * SEG)
    assert (report.freed_bytes, report.forced_by_disk) == (0, 0)
    assert SegmentInfo("p", 10, 30, 0).size_bytes == 20


@given(
    ages=st.lists(st.integers(0, 200), max_size=12),
    retention_h=st.integers(-1, 150),
    used=st.floats(0.0, 1.0),
    high=st.floats(0.01, 1.0),
    with_total=st.booleans(),
)
def test_property_a_prefix_without_the_active_segment(ages: list[int], retention_h: int,
                                                      used: float, high: float, with_total: bool) -> None:
    segments = segs(ages)
    total = 10 * SEG if with_total else None
    got = delete(segments, retention_h=retention_h, used=used, high=high, total=total)
    assert got == list(range(len(got)))  # oldest first, contiguous from the start
    assert len(got) <= max(0, len(segments) - 1)
    if used < high:  # no pressure: exactly the expired prefix
        expired = 0
        for a in ages[:-1]:
            if retention_h < 0 or a < retention_h:
                break
            expired += 1
        assert len(got) == expired
