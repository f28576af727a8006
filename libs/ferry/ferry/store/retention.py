"""Retention policy: which commit-log segments to delete, decided without touching disk.

The commit log only ever loses its oldest segments, so a plan is always a prefix of
the segments ordered by start offset, and never includes the last (active) one.
Two reasons delete a segment:

- age: its last modification is at least `retention_ms` old (`retention_ms < 0`
  turns age-based deletion off);
- disk: while the disk is at or above `high_water_ratio`, the oldest segments go
  even if they have not expired. With `disk_total_bytes` given, as many as needed to
  bring the projected ratio below the mark (each frees its own size); without it,
  one segment per call, so repeated runs converge without over-deleting on a guess.

`MessageStore.run_retention()` lists the segments, applies the plan, then moves the
consume queues and index files past the new minimum phy offset.
"""
from __future__ import annotations

from dataclasses import dataclass

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


@dataclass(frozen=True)
class RetentionReport:
    """What one retention run did (built by MessageStore.run_retention)."""

    deleted_segments: int
    new_min_phy_offset: int
    freed_bytes: int = 0
    forced_by_disk: int = 0
    deleted_queue_segments: int = 0
    deleted_index_files: int = 0


def plan_retention(
    segments: list[SegmentInfo],
    *,
    now_ms: int,
    retention_ms: int,
    disk_used_ratio: float,
    high_water_ratio: float,
    disk_total_bytes: int | None = None,
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
    if retention_ms >= 0:
        for seg in candidates:
            if seg.last_modified_ms + retention_ms > now_ms:
                break  # a younger segment: later ones stay too, the log has no holes
            chosen.append(seg)
    expired = len(chosen)
    ratio = disk_used_ratio
    if disk_total_bytes is not None:
        ratio -= sum(s.size_bytes for s in chosen) / disk_total_bytes
    for seg in candidates[expired:]:
        if ratio < high_water_ratio:
            break
        chosen.append(seg)
        if disk_total_bytes is None:
            break  # no way to know what one segment frees: one per call
        ratio -= seg.size_bytes / disk_total_bytes
    return RetentionPlan(tuple(chosen), expired, len(chosen) - expired)
