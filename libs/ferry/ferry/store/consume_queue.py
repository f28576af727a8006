"""Consume queues: the per-(topic, queue) index of a topic's messages in the commit log.

A consume queue turns "message number N of orders/3" into "the record at commit-log
byte P, S bytes long, tag hash T". Consumers pull by queue offset, so the queue is an
array of fixed 20-byte entries (`CQ_ENTRY`) cut into segment files of
`entries_per_segment` entries each:

    <root>/consumequeue/<topic>/<queue_id>/<20-digit queue offset of the segment's first entry>

Segment files are created at full size (sparse) and memory-mapped; an entry whose
size field is 0 is empty (never written), which is how reopen finds the end.
The broker dispatches one packed run of entries per batch (`append`) and pulls read
ranges (`get`); both are one slice of a mapping. Entries of one queue are written in
commit-log order, so their phy offsets increase: recovery and retention binary search
them. See docs/store-format.md for the byte layout.
"""
from __future__ import annotations

import logging
import mmap
import os
from bisect import bisect_right

from ferry.errors import StoreError
from ferry.names import validate_topic

from .cq_segment import (
    CQ_ENTRY,
    ENTRY_SIZE,
    SEGMENT_NAME_DIGITS,
    MappingLru,
    Segment,
    create_segment,
    data_end,
    first_used,
    last_used,
    segment_name,
)

log = logging.getLogger(__name__)

__all__ = ["CQ_ENTRY", "MAX_MAPPED_SEGMENTS", "ConsumeQueue", "segment_name"]

# Segments mapped at once across all queues of a store (each mapping holds a file
# descriptor); see MappingLru.
MAX_MAPPED_SEGMENTS = 256


class ConsumeQueue:
    """The consume queue of one (topic, queue_id): append entries, read ranges by offset."""

    def __init__(
        self, root_dir: str, topic: str, queue_id: int, entries_per_segment: int = 300_000,
        lru: MappingLru | None = None, new_dirs: set[str] | None = None,
    ) -> None:
        validate_topic(topic, allow_internal=True)
        if queue_id < 0:
            raise StoreError(f"queue id must be >= 0, got {queue_id}")
        if entries_per_segment <= 0:
            raise StoreError(f"entries_per_segment must be > 0, got {entries_per_segment}")
        self.topic = topic
        self.queue_id = queue_id
        self.entries_per_segment = entries_per_segment
        self._dir = os.path.join(root_dir, "consumequeue", topic, str(queue_id))
        # Directories whose entries changed since the last checkpoint (it fsyncs them).
        self._new_dirs = new_dirs if new_dirs is not None else set()
        if not os.path.isdir(self._dir):
            topic_dir = os.path.dirname(self._dir)
            if not os.path.isdir(topic_dir):
                self._new_dirs.add(os.path.dirname(topic_dir))
            self._new_dirs.add(topic_dir)
            os.makedirs(self._dir, exist_ok=True)
        self._segments: list[Segment] = []
        self._bases: list[int] = []
        self._lru = lru if lru is not None else MappingLru(MAX_MAPPED_SEGMENTS)
        self._min = 0
        self._max = 0
        self._load()

    # -- state -------------------------------------------------------------------------

    @property
    def min_offset(self) -> int:
        """First queue offset still stored (entries below it were deleted by retention)."""
        return self._min

    @property
    def max_offset(self) -> int:
        """Next queue offset to be written."""
        return self._max

    def _load(self) -> None:
        for name in sorted(os.listdir(self._dir)):
            path = os.path.join(self._dir, name)
            if name.endswith(".tmp"):
                os.remove(path)  # a segment whose creation did not finish
                continue
            if len(name) != SEGMENT_NAME_DIGITS or not name.isdigit():
                continue
            size = os.path.getsize(path)
            if size < ENTRY_SIZE or size % ENTRY_SIZE:
                raise StoreError(f"consume queue segment {path} has a bad size {size}")
            self._segments.append(Segment(path, int(name), size // ENTRY_SIZE, self._lru))
        self._bases = [s.base for s in self._segments]
        self._drop_after_gap()
        # Drop trailing segments with no entry: created by a roll just before a crash.
        while len(self._segments) > 1 and self._used_in_last() == 0:
            self._drop_last_segment()
        if not self._segments:
            return
        self._max = self._segments[-1].base + self._used_in_last()
        first = self._segments[0]
        if self._max > first.base:
            self._min = min(first.base + first_used(self._map(first), first.capacity), self._max)
        else:
            self._min = self._max

    def _drop_after_gap(self) -> None:
        """Drop the segments after a missing one (its name was lost in a power cut).

        Segments are created in order and their directory is fsynced at the next
        checkpoint, so a lost one and those after it were created after the last
        checkpoint: they hold only entries that recovery re-dispatches.
        """
        for i in range(1, len(self._segments)):
            prev = self._segments[i - 1]
            if self._segments[i].base != prev.end:
                log.warning("consume queue %s/%d: no segment at queue offset %d; dropping "
                            "the %d segment(s) after it (recovery rebuilds them)",
                            self.topic, self.queue_id, prev.end, len(self._segments) - i)
                while len(self._segments) > i:
                    self._drop_last_segment()
                return

    def _used_in_last(self) -> int:
        last = self._segments[-1]
        size = last.capacity * ENTRY_SIZE
        return last_used(self._active_mm(), last.capacity, data_end(last.path, size))

    def _drop_last_segment(self) -> None:
        seg = self._segments.pop()
        self._bases.pop()
        seg.unmap()
        os.remove(seg.path)

    def _active_mm(self) -> mmap.mmap:
        return self._segments[-1].map()

    @staticmethod
    def _map(seg: Segment) -> mmap.mmap:
        """The mapping of `seg` (mapped on demand within the store's MappingLru)."""
        return seg.mm or seg.map()

    def _segment_for(self, queue_offset: int) -> Segment:
        i = bisect_right(self._bases, queue_offset) - 1
        if i < 0 or queue_offset >= self._segments[i].end:
            raise StoreError(f"queue offset {queue_offset} of {self.topic}/{self.queue_id} is not stored")
        return self._segments[i]

    def _phy_at(self, queue_offset: int) -> int:
        seg = self._segment_for(queue_offset)
        phy, _size, _tag_hash = CQ_ENTRY.unpack_from(self._map(seg),
                                                     (queue_offset - seg.base) * ENTRY_SIZE)
        return int(phy)

    def _first_with_phy_at_least(self, lo: int, hi: int, phy_offset: int) -> int:
        """Smallest queue offset in [lo, hi) whose phy is >= phy_offset (hi if none)."""
        while lo < hi:
            mid = (lo + hi) // 2
            if self._phy_at(mid) < phy_offset:
                lo = mid + 1
            else:
                hi = mid
        return lo

    # -- write -------------------------------------------------------------------------

    def first_offset_at_phy(self, lo: int, hi: int, phy_offset: int) -> int:
        """Smallest queue offset in [lo, hi) whose record lies at or after commit-log offset
        `phy_offset` (hi if none): where a history boundary falls in this queue."""
        return self._first_with_phy_at_least(max(lo, self.min_offset), min(hi, self.max_offset),
                                             phy_offset)

    def append(self, queue_offset: int, packed_entries: bytes) -> None:
        """Write the packed `CQ_ENTRY` run starting at `queue_offset`.

        `queue_offset` is `max_offset` when dispatching new messages; recovery may
        re-dispatch below it, which overwrites the same entries in place (idempotent).
        """
        total = len(packed_entries)
        if total % ENTRY_SIZE:
            raise StoreError(f"packed entries length {total} is not a multiple of {ENTRY_SIZE}")
        if total == 0:
            return
        count = total // ENTRY_SIZE
        if queue_offset == self._max and self._segments:
            seg = self._segments[-1]
            if seg.base <= queue_offset and queue_offset + count <= seg.end:
                # The put path: new entries that fit the active segment, one copy.
                at = (queue_offset - seg.base) * ENTRY_SIZE
                (seg.mm or seg.map())[at : at + total] = packed_entries
                seg.dirty = True
                self._max = queue_offset + count
                return
        if not self._segments:
            # A fresh queue starts where its first message says (0, unless the
            # consume queue files were lost and recovery rebuilds it).
            self._add_segment(queue_offset)
            self._min = self._max = queue_offset
        elif queue_offset > self._max:
            raise StoreError(
                f"{self.topic}/{self.queue_id}: append at {queue_offset} leaves a gap after {self._max}"
            )
        end = queue_offset + count
        data = memoryview(packed_entries)
        if queue_offset < self._segments[0].base:
            # Re-dispatch of entries whose segment retention already deleted.
            skip = min(count, self._segments[0].base - queue_offset)
            data = data[skip * ENTRY_SIZE :]
            queue_offset += skip
        pos = queue_offset
        while pos < end:
            seg = self._segments[-1] if pos >= self._bases[-1] else self._segment_for(pos)
            if pos >= seg.end:
                seg = self._add_segment(pos)
            n = min(end, seg.end) - pos
            at = (pos - seg.base) * ENTRY_SIZE
            done = (pos - queue_offset) * ENTRY_SIZE
            self._map(seg)[at : at + n * ENTRY_SIZE] = data[done : done + n * ENTRY_SIZE]
            seg.dirty = True
            pos += n
        if end > self._max:
            self._max = end

    def _add_segment(self, base: int) -> Segment:
        seg = create_segment(self._dir, base, self.entries_per_segment, self._lru)
        self._new_dirs.add(self._dir)
        if self._segments:
            self._segments[-1].flush()  # a sealed segment is durable before the next takes writes
        self._segments.append(seg)
        self._bases.append(base)
        return seg

    # -- read --------------------------------------------------------------------------

    def get(self, queue_offset: int, max_count: int) -> list[tuple[int, int, int]]:
        """Up to `max_count` entries (phy_offset, size, tag_hash) from `queue_offset` on."""
        if queue_offset < self._min or queue_offset >= self._max or max_count <= 0:
            return []
        end = min(self._max, queue_offset + max_count)
        seg = self._segments[-1]
        if queue_offset >= seg.base:  # the common case: a consumer near the head
            mm = seg.map()
            return list(
                CQ_ENTRY.iter_unpack(mm[(queue_offset - seg.base) * ENTRY_SIZE : (end - seg.base) * ENTRY_SIZE])
            )
        out: list[tuple[int, int, int]] = []
        pos = queue_offset
        while pos < end:
            seg = self._segment_for(pos)
            stop = min(end, seg.end)
            mm = self._map(seg)
            out.extend(CQ_ENTRY.iter_unpack(mm[(pos - seg.base) * ENTRY_SIZE : (stop - seg.base) * ENTRY_SIZE]))
            pos = stop
        return out

    def last_entry(self) -> tuple[int, int, int] | None:
        """The newest stored entry, or None when the queue stores none."""
        if not self._segments or self._max <= self._segments[0].base:
            return None
        seg = self._segments[-1]
        if self._max <= seg.base:
            seg = self._segment_for(self._max - 1)
        phy, size, tag_hash = CQ_ENTRY.unpack_from(self._map(seg),
                                                   (self._max - 1 - seg.base) * ENTRY_SIZE)
        return (phy, size, tag_hash)

    # -- recovery and retention --------------------------------------------------------

    def truncate_from_phy(self, phy_offset: int) -> None:
        """Drop every entry whose phy offset is >= `phy_offset` (recovery of a torn log)."""
        if not self._segments:
            return
        lo = self._segments[0].base
        cut = self._first_with_phy_at_least(lo, self._max, phy_offset)
        if cut == self._max:
            return
        while len(self._segments) > 1 and self._segments[-1].base >= cut and self._segments[-2].end >= cut:
            self._drop_last_segment()
        seg = self._segments[-1]
        start = max(cut, seg.base)
        stop = min(self._max, seg.end)
        if stop > start:
            mm = seg.map()
            mm[(start - seg.base) * ENTRY_SIZE : (stop - seg.base) * ENTRY_SIZE] = bytes(
                (stop - start) * ENTRY_SIZE
            )
            seg.dirty = True
        self._max = cut
        self._min = min(self._min, cut)

    def delete_below_phy(self, min_phy: int) -> int:
        """Retention: delete whole segments whose entries all point below `min_phy`.

        The active (last) segment is always kept. `min_offset` moves up to the first
        entry whose phy is >= `min_phy`. Returns the number of segment files deleted.
        """
        deleted = 0
        while len(self._segments) > 1 and self._phy_at(self._segments[0].end - 1) < min_phy:
            self._drop_first_segment()
            deleted += 1
        if self._segments:
            lo = max(self._min, self._segments[0].base)
            self._min = self._first_with_phy_at_least(min(lo, self._max), self._max, min_phy)
        return deleted

    def advance_min(self, queue_offset: int) -> int:
        """Per-topic retention: entries below `queue_offset` (at most `max_offset`) are gone.

        Whole segments below it are deleted (never the active one); in the first one
        left, the entries below the new minimum are zeroed, so that a reopen finds
        the same minimum, all but the newest entry: that one gives a reopen the
        queue's end (a reopened queue whose entries all expired shows that one again
        until the next retention run). Returns the segment files deleted.
        """
        target = min(queue_offset, self._max)
        if target <= self._min:
            return 0
        old, deleted = self._min, 0
        while len(self._segments) > 1 and self._segments[0].end <= target:
            self._drop_first_segment()
            deleted += 1
        self._min = target
        seg = self._segments[0]
        start, stop = max(seg.base, old), min(target, seg.end, self._max - 1)
        if stop > start:
            self._map(seg)[(start - seg.base) * ENTRY_SIZE : (stop - seg.base) * ENTRY_SIZE] = \
                bytes((stop - start) * ENTRY_SIZE)
            seg.dirty = True
        return deleted

    def _drop_first_segment(self) -> None:
        first = self._segments.pop(0)
        self._bases.pop(0)
        first.unmap()
        os.remove(first.path)

    # -- durability --------------------------------------------------------------------

    def flush(self) -> None:
        """msync every segment written since the last flush."""
        for seg in self._segments:
            seg.flush()

    def take_dirty(self, out: list[str]) -> None:
        """Append to `out` the paths of segments written since the last call; mark them clean.

        The caller makes them durable later, outside the store lock (see
        consume_queues.ConsumeQueues.take_dirty).
        """
        for seg in self._segments:
            if seg.dirty:
                seg.dirty = False
                out.append(seg.path)

    def close(self) -> None:
        for seg in self._segments:
            seg.unmap()
