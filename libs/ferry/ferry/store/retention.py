"""Retention policy: which commit-log segments to delete, decided without touching disk.

The commit log only ever loses its oldest segments, so a plan is always a prefix of
the segments ordered by start offset, and never includes the last (active) one.
Two reasons delete a segment:

- age: its last modification is at least `retention_ms` old (`retention_ms < 0`
  turns age-based deletion off); with `retention_of`, the segment's own retention
  instead (per-topic retention: topic_retention.py);
- disk: while the disk is at or above `high_water_ratio`, the oldest segments go
  even if they have not expired. With `disk_total_bytes` given, as many as needed to
  bring the projected ratio below the mark (each frees its own size); without it,
  one segment per call, so repeated runs converge without over-deleting on a guess.
  With `protected_from` (a phy offset: the retention floor) the disk reason never
  takes a segment that holds a byte at or past it: records some reader has not
  passed stay however full the disk is (`held_by_floor` says the floor stopped it).
  The broker passes the floor unless told to force (docs/operations.md); age-based
  deletion ignores it, as in Kafka and RocketMQ.

`MessageStore.run_retention()` lists the segments, applies the plan, then moves the
consume queues and index files past the new minimum phy offset.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from ferry.errors import StoreError


@dataclass(frozen=True)
class SegmentInfo:
    """One commit-log segment as retention sees it."""

    path: str
    start_offset: int  # phy offset of the segment's first byte
    end_offset: int  # phy offset just past its last byte (start + file size)
    last_modified_ms: int

    @property
    def size_bytes(self) -> int:
        return self.end_offset - self.start_offset


@dataclass(frozen=True)
class RetentionPlan:
    """The segments to delete, oldest first, and how many each reason claimed."""

    segments: tuple[SegmentInfo, ...]
    expired: int
    forced_by_disk: int
    held_by_floor: bool = False  # the disk wanted more, the retention floor kept it


@dataclass(frozen=True)
class RetentionFloor:
    """What disk pressure must keep: every record at or past the smallest of these.

    `queue_positions`: per (topic, queue_id), the first queue offset some reader
    has not passed (for the broker: the smallest committed offset of any group);
    the floor is the phy offset of that queue entry. `phy_offset`: a commit-log
    position that must stay readable too (a connected slave's acknowledged end).
    """

    queue_positions: Mapping[tuple[str, int], int] = field(default_factory=dict)
    phy_offset: int | None = None


@dataclass(frozen=True)
class RetentionReport:
    """What one retention run did (built by MessageStore.run_retention)."""

    deleted_segments: int
    new_min_phy_offset: int
    freed_bytes: int = 0
    forced_by_disk: int = 0
    deleted_queue_segments: int = 0
    deleted_index_files: int = 0
    held_by_floor: bool = False


def plan_retention(
    segments: list[SegmentInfo],
    *,
    now_ms: int,
    retention_ms: int,
    disk_used_ratio: float,
    high_water_ratio: float,
    disk_total_bytes: int | None = None,
    protected_from: int | None = None,
    retention_of: Callable[[SegmentInfo], int] | None = None,
) -> RetentionPlan:
    """Decide which segments to delete (see the module docstring for the rules)."""
    if not 0.0 < high_water_ratio <= 1.0:
        raise StoreError(f"high_water_ratio must be in (0, 1], got {high_water_ratio}")
    if not 0.0 <= disk_used_ratio <= 1.0:
        raise StoreError(f"disk_used_ratio must be in [0, 1], got {disk_used_ratio}")
    if disk_total_bytes is not None and disk_total_bytes <= 0:
        raise StoreError(f"disk_total_bytes must be > 0, got {disk_total_bytes}")
    candidates = sorted(segments, key=lambda s: s.start_offset)[:-1]  # never the active one
    chosen: list[SegmentInfo] = []
    for seg in candidates:
        ms = retention_ms if retention_of is None else retention_of(seg)
        if ms < 0 or seg.last_modified_ms + ms > now_ms:
            break  # a younger segment: later ones stay too, the log has no holes
        chosen.append(seg)
    expired = len(chosen)
    ratio = disk_used_ratio
    if disk_total_bytes is not None:
        ratio -= sum(s.size_bytes for s in chosen) / disk_total_bytes
    held = False
    for seg in candidates[expired:]:
        if ratio < high_water_ratio:
            break
        if protected_from is not None and seg.end_offset > protected_from:
            held = True  # a reader has not passed this segment: it stays
            break
        chosen.append(seg)
        if disk_total_bytes is None:
            break  # no way to know what one segment frees: one per call
        ratio -= seg.size_bytes / disk_total_bytes
    return RetentionPlan(tuple(chosen), expired, len(chosen) - expired, held)
