"""Per-topic retention over the shared commit log: trim a topic's queues, hold shared segments.

Every topic's records share one commit log (RocketMQ's layout), so a topic cannot
delete "its" segments. Per-topic retention (`TopicRetention`, from the topic's
config) works in two steps, both run by `MessageStore.run_retention` before the
commit-log plan:

1. Trim: each queue of a topic with its own retention moves its minimum offset
   forward (`ConsumeQueue.advance_min`) past
   - (time) every entry in a commit-log segment whose last modification is at least
     the topic's `retention_ms` old, counted like the broker-wide rule: a prefix of
     the segments, never the active one;
   - (size) the oldest entries beyond `retention_bytes` per queue (record sizes
     summed from the newest entry back, like Kafka's per-partition
     `retention.bytes`).
2. Hold: a segment expires by age only when every queue still holding an entry in it
   has reached its own retention: its effective retention is the longest among the
   topics whose queues still point into it (the broker default for topics without
   their own). A segment that no queue points into any more goes.

Time is the caller's: `now_ms` and the segments' modification times, nothing else.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from ferry.errors import StoreError

from .consume_queue import ConsumeQueue
from .consume_queues import ConsumeQueues
from .retention import SegmentInfo

__all__ = ["TopicRetention", "segment_retention", "trim_topics"]

# Entries read per step when summing a queue's sizes from its newest entry back.
_SIZE_SCAN_ENTRIES = 4096


@dataclass(frozen=True)
class TopicRetention:
    """One topic's own retention; None keeps the store's default (time) or no limit (size)."""

    retention_ms: int | None = None
    retention_bytes: int | None = None  # per queue of the topic

    def __post_init__(self) -> None:
        if self.retention_ms is not None and self.retention_ms < 0:
            raise StoreError(f"retention_ms must be >= 0, got {self.retention_ms}")
        if self.retention_bytes is not None and self.retention_bytes < 0:
            raise StoreError(f"retention_bytes must be >= 0, got {self.retention_bytes}")


_NONE = TopicRetention()


def expired_end(segments: list[SegmentInfo], now_ms: int, retention_ms: int) -> int | None:
    """End phy offset of the longest prefix of non-active segments expired at `retention_ms`."""
    end = None
    for seg in sorted(segments, key=lambda s: s.start_offset)[:-1]:
        if seg.last_modified_ms + retention_ms > now_ms:
            break
        end = seg.end_offset
    return end


def _sizes(cq: ConsumeQueue, lo: int, hi: int) -> int:
    total = 0
    while lo < hi:
        entries = cq.get(lo, min(_SIZE_SCAN_ENTRIES, hi - lo))
        total += sum(size for _phy, size, _tag in entries)
        lo += len(entries) or hi - lo
    return total


def _tail_within(cq: ConsumeQueue, limit: int) -> tuple[int, int]:
    """(first offset, bytes from it to the end): the newest records totalling <= `limit`."""
    lo, total, pos = cq.min_offset, 0, cq.max_offset
    while pos > lo:
        start = max(lo, pos - _SIZE_SCAN_ENTRIES)
        entries = cq.get(start, pos - start)
        for i in range(len(entries) - 1, -1, -1):
            if total + entries[i][1] > limit:
                return start + i + 1, total
            total += entries[i][1]
        pos = start
    return lo, total


def _keep_bytes_from(cq: ConsumeQueue, limit: int, known: dict[tuple[str, int],
                     tuple[int, int, int]]) -> int:
    """The first queue offset from which the queue's records total at most `limit` bytes.

    With the last run's total (`known`, still valid when the minimum did not move
    since) only the entries added and those dropped are read; otherwise the newest
    are summed back from the end, at most `limit` bytes' worth."""
    key, lo, hi = (cq.topic, cq.queue_id), cq.min_offset, cq.max_offset
    first, last = cq.get(lo, 1), cq.last_entry()
    if not first or last is None or last[0] + last[1] - first[0][0] <= limit:
        known.pop(key, None)
        return lo  # all its records lie within fewer bytes of the log than the limit
    prev = known.get(key)
    if prev is None or prev[0] != lo or not prev[1] <= hi:
        start, total = _tail_within(cq, limit)
    else:
        start, total = lo, prev[2] + _sizes(cq, prev[1], hi)
        while total > limit and start < hi:
            for _phy, size, _tag in cq.get(start, min(_SIZE_SCAN_ENTRIES, hi - start)):
                if total <= limit:
                    break
                total -= size
                start += 1
    known[key] = (start, hi, total)
    return start


def trim_topics(cqs: ConsumeQueues, segments: list[SegmentInfo], now_ms: int,
                topics: Mapping[str, TopicRetention]) -> int:
    """Step 1: move the minimum of each queue of `topics` past what it no longer keeps.

    Returns the consume-queue segment files deleted."""
    ends: dict[int, int | None] = {}
    deleted = 0
    for cq in cqs:
        own = topics.get(cq.topic)
        if own is None or cq.min_offset >= cq.max_offset:
            continue
        target = cq.min_offset
        if own.retention_ms is not None:
            if own.retention_ms not in ends:
                ends[own.retention_ms] = expired_end(segments, now_ms, own.retention_ms)
            end = ends[own.retention_ms]
            if end is not None:
                target = cq.first_offset_at_phy(cq.min_offset, cq.max_offset, end)
        if own.retention_bytes is not None:
            target = max(target, _keep_bytes_from(cq, own.retention_bytes, cqs.kept_bytes))
        deleted += cq.advance_min(target)
    for key in [k for k in cqs.kept_bytes if topics.get(k[0], _NONE).retention_bytes is None]:
        del cqs.kept_bytes[key]  # no size limit any more: forget its total
    return deleted


def segment_retention(cqs: ConsumeQueues, topics: Mapping[str, TopicRetention],
                      default_ms: int) -> Callable[[SegmentInfo], int]:
    """Step 2: a segment's effective retention (ms), from the queues still pointing into it."""
    spans: list[tuple[int, int, int]] = []  # (first phy, last phy, the topic's retention_ms)
    for cq in cqs:
        first, last = cq.get(cq.min_offset, 1), cq.last_entry()
        if not first or last is None:
            continue
        own = topics.get(cq.topic)
        ms = default_ms if own is None or own.retention_ms is None else own.retention_ms
        spans.append((first[0][0], last[0], ms))

    def retention_of(seg: SegmentInfo) -> int:
        held = [ms for lo, hi, ms in spans if lo < seg.end_offset and hi >= seg.start_offset]
        # A holder that keeps its records forever (< 0: age deletion off) keeps the segment.
        return -1 if any(ms < 0 for ms in held) else max(held, default=0)

    return retention_of
