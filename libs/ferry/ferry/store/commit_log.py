"""The commit log: every message of every topic, appended to fixed-size segments.

Segments live under `<root>/commitlog/`, each named by the 20-digit commit-log
offset of its first byte, all `segment_bytes` long. A record never straddles two
segments: when the next record would not leave `BLANK_SIZE` bytes free, a blank
marker fills the rest and the record goes to the next segment. The appender
(appender.py) writes staged batches into the active segment, rolls and publishes
the write position through `active`, `roll` and `advance`; reads are zero-copy
memoryview slices.

Threads: one writer (the store's caller, under the store lock) appends, rolls and
deletes; the flush thread calls `flush`, which duplicates the descriptors it
needs under `_segments_lock` and fdatasyncs them outside it.
"""
from __future__ import annotations

import logging
import os
import threading
from collections.abc import Sequence

from ferry.codec.record import BLANK, BLANK_MAGIC
from ferry.errors import StoreError

from .mapped_file import MappedFile, segment_name

log = logging.getLogger(__name__)

# `cut` overwrites a discarded tail with zeros this many bytes at a time.
ZERO_CHUNK_BYTES = 1 << 20


class CommitLog:
    """Segment list, write position and flushed position of the commit log."""

    def __init__(self, root_dir: str, segment_bytes: int) -> None:
        self.dir = os.path.join(root_dir, "commitlog")
        self.segment_bytes = segment_bytes
        os.makedirs(self.dir, exist_ok=True)
        self._segments: list[MappedFile] = []
        self._segments_lock = threading.Lock()
        self._write_offset = 0
        self._flushed_offset = 0
        # Bumped by `cut`: a flush that began before a cut does not count its target
        # as flushed (the bytes it synced may have been replaced since).
        self._cuts = 0
        for name in sorted(os.listdir(self.dir)):
            path = os.path.join(self.dir, name)
            if name.endswith(".tmp"):
                os.remove(path)  # a segment whose creation did not finish
                continue
            if len(name) != 20 or not name.isdigit():
                log.warning("ignoring stray file %s in the commit log directory", path)
                continue
            start = int(name)
            if start % segment_bytes:
                raise StoreError(f"segment {path} does not start on a {segment_bytes}-byte boundary")
            if self._segments and start != self._segments[-1].end_offset:
                raise StoreError(f"commit log has a gap before {path}")
            self._segments.append(MappedFile(path, start, segment_bytes, create=False))

    # -- positions ---------------------------------------------------------------------

    @property
    def segments(self) -> Sequence[MappedFile]:
        return tuple(self._segments)

    @property
    def min_offset(self) -> int:
        """First commit-log byte still stored."""
        return self._segments[0].start_offset if self._segments else 0

    @property
    def write_offset(self) -> int:
        """Where the next record goes (the end of the written data)."""
        return self._write_offset

    @property
    def flushed_offset(self) -> int:
        """Everything below this is on disk (fdatasync'd)."""
        return self._flushed_offset

    def set_positions(self, write_offset: int) -> None:
        """Recovery's verdict: data ends at `write_offset`, all of it counted as flushed."""
        if not self._segments:
            start = write_offset - write_offset % self.segment_bytes
            self._add_segment(start)
        elif write_offset >= self._segments[-1].end_offset:
            self._add_segment(self._segments[-1].end_offset)
        self._write_offset = write_offset
        self._flushed_offset = write_offset

    # -- write -------------------------------------------------------------------------

    def active(self) -> MappedFile:
        """The segment appends go to (the writer encodes into its mapping)."""
        return self._segments[-1]

    def advance(self, write_offset: int) -> None:
        """The writer finished encoding up to `write_offset`: publish it."""
        self._write_offset = write_offset

    def roll(self, seg: MappedFile, rel: int) -> MappedFile:
        """Seal the active segment with a blank marker at `rel`; return the next (now active)."""
        BLANK.pack_into(seg.mm, rel, seg.size - rel, BLANK_MAGIC)
        nxt = self._add_segment(seg.end_offset)
        self._write_offset = nxt.start_offset
        return nxt

    def _add_segment(self, start: int) -> MappedFile:
        path = os.path.join(self.dir, segment_name(start))
        if os.path.exists(path):  # left empty by a crash right after a roll
            seg = MappedFile(path, start, self.segment_bytes, create=False)
            seg.zero_from(0)
        else:
            seg = MappedFile(path, start, self.segment_bytes, create=True)
            _fsync_dir(self.dir)
        with self._segments_lock:
            self._segments.append(seg)
        return seg

    # -- read --------------------------------------------------------------------------

    def segment_for(self, phy_offset: int) -> MappedFile | None:
        segs = self._segments
        if not segs:
            return None
        i = (phy_offset - segs[0].start_offset) // self.segment_bytes
        if i < 0 or i >= len(segs):
            return None
        return segs[i]

    def read(self, phy_offset: int, size: int) -> memoryview | None:
        """A read-only view of `size` bytes at `phy_offset`, or None when not stored."""
        segs = self._segments
        i = (phy_offset - segs[0].start_offset) // self.segment_bytes
        if i < 0 or i >= len(segs) or phy_offset + size > self._write_offset or size <= 0:
            return None
        seg = segs[i]
        rel = phy_offset - seg.start_offset
        if rel + size > seg.size:
            return None
        return seg.read_view[rel:rel + size]

    # -- durability, recovery, retention ----------------------------------------------

    def flush(self, target: int | None = None) -> int:
        """fdatasync every segment holding data below `target` (default: all written)."""
        end = self._write_offset if target is None else target
        if end <= self._flushed_offset:
            return self._flushed_offset
        # fdatasync duplicates of the descriptors outside the lock: a roll (the writer
        # adding a segment) never waits behind a slow disk, and retention closing a
        # segment meanwhile cannot pull the descriptor from under the sync.
        with self._segments_lock:
            cuts = self._cuts
            fds = [os.dup(seg.fd) for seg in self._segments
                   if seg.start_offset < end and seg.end_offset > self._flushed_offset]
        try:
            for fd in fds:
                os.fdatasync(fd)
        finally:
            for fd in fds:
                os.close(fd)
        with self._segments_lock:
            if cuts == self._cuts:
                self._flushed_offset = max(self._flushed_offset, end)
        return self._flushed_offset

    def truncate(self, phy_offset: int) -> None:
        """Recovery: discard everything from `phy_offset` on (segments after it are deleted)."""
        with self._segments_lock:
            while self._segments and self._segments[-1].start_offset > phy_offset:
                dropped = self._segments.pop()
                log.warning("recovery: deleting commit-log segment %s past the end of valid data",
                            dropped.path)
                dropped.delete()
        seg = self.segment_for(phy_offset)
        if seg is not None and phy_offset < seg.end_offset:
            seg.zero_from(phy_offset - seg.start_offset)

    def cut(self, phy_offset: int) -> None:
        """Discard everything from `phy_offset` on while the store is open (a replica
        dropping a tail that diverged from its master); durable when it returns.

        Unlike `truncate` the file is never shrunk (a reader on another thread may
        hold a view of the mapping): the bytes written past `phy_offset` in its
        segment are overwritten with zeros and fdatasync'd, so a crash right after
        cannot bring them back; the segments after it are deleted.
        """
        old_end = self._write_offset
        with self._segments_lock:
            self._cuts += 1
            self._flushed_offset = min(self._flushed_offset, phy_offset)
            dropped: list[MappedFile] = []
            while self._segments and self._segments[-1].start_offset > phy_offset:
                dropped.append(self._segments.pop())
        for gone in dropped:
            gone.delete()
        if dropped:
            _fsync_dir(self.dir)
        seg = self.segment_for(phy_offset)
        if seg is not None:
            rel = phy_offset - seg.start_offset
            stop = min(old_end, seg.end_offset) - seg.start_offset
            zeros = memoryview(bytes(min(ZERO_CHUNK_BYTES, max(stop - rel, 0))))
            while rel < stop:
                n = min(stop - rel, len(zeros))
                seg.write(zeros[:n], rel)
                rel += n
            seg.flush()
        self._write_offset = phy_offset

    def delete_segments(self, starts: set[int]) -> int:
        """Retention: delete the (non-active) segments starting at `starts`."""
        deleted = 0
        with self._segments_lock:
            keep: list[MappedFile] = []
            for i, seg in enumerate(self._segments):
                if seg.start_offset in starts and i < len(self._segments) - 1 and not keep:
                    seg.delete()
                    deleted += 1
                else:
                    keep.append(seg)
            self._segments = keep
        return deleted

    def close(self) -> None:
        with self._segments_lock:
            for seg in self._segments:
                seg.close()
            self._segments = []


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
