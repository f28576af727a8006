"""Consume-queue segment files: the entry layout and the helpers that find where data ends.

A segment is a sparse, memory-mapped array of `CQ_ENTRY` with no header, named by
the queue offset of its first entry (see consume_queue.py and
docs/store-format.md).
"""
from __future__ import annotations

import errno
import mmap
import os
import struct

# One entry, little-endian:
#   0  phy_offset  i64  byte position of the record in the commit log
#   8  size        i32  record size in bytes (0 = empty entry)
#  12  tag_hash    i64  tag_hash(tags) of the message (0 = no tag)
CQ_ENTRY = struct.Struct("<qiq")
ENTRY_SIZE = CQ_ENTRY.size  # 20
SEGMENT_NAME_DIGITS = 20
_SCAN_CHUNK_BYTES = 1 << 20


def segment_name(first_queue_offset: int) -> str:
    """The file name of a segment whose first entry is `first_queue_offset`."""
    return f"{first_queue_offset:0{SEGMENT_NAME_DIGITS}d}"


class Segment:
    """One segment file: `capacity` entries starting at queue offset `base`.

    Mapped on demand; every mapping holds a file descriptor (mmap dups it), so the
    mappings of all segments of all queues share one `MappingLru` budget.
    `dirty` means written since the last checkpoint and survives an unmap: the
    written pages stay in the page cache until the checkpoint fdatasyncs the file.
    """

    __slots__ = ("base", "capacity", "path", "mm", "dirty", "lru")

    def __init__(self, path: str, base: int, capacity: int, lru: MappingLru | None = None) -> None:
        self.path = path
        self.base = base
        self.capacity = capacity
        self.mm: mmap.mmap | None = None
        self.dirty = False
        self.lru = lru

    @property
    def end(self) -> int:
        return self.base + self.capacity

    def map(self) -> mmap.mmap:
        if self.mm is None:
            with open(self.path, "r+b") as f:
                self.mm = mmap.mmap(f.fileno(), self.capacity * ENTRY_SIZE)
            if self.lru is not None:
                self.lru.mapped(self)
        return self.mm

    def flush(self) -> None:
        """Make what was written durable (msync if mapped, else fdatasync the file)."""
        if self.dirty:
            if self.mm is not None:
                self.mm.flush()
            else:
                fd = os.open(self.path, os.O_RDONLY)
                try:
                    os.fdatasync(fd)
                finally:
                    os.close(fd)
        self.dirty = False

    def unmap(self) -> None:
        """Drop the mapping (and its file descriptor); `dirty` is kept for the checkpoint."""
        if self.mm is not None:
            self.mm.close()
            self.mm = None
            if self.lru is not None:
                self.lru.forget(self)


class MappingLru:
    """Bounds how many segments are mapped at once, across every consume queue.

    Each mapping holds a file descriptor, and a broker may have thousands of
    queues: beyond `max_mapped` the segment mapped longest ago is unmapped (it is
    mapped again on its next use). Mapping order, not use order: tracking every
    append would cost the put path, and for a hot set within the budget the two
    agree.
    """

    def __init__(self, max_mapped: int = 256) -> None:
        if max_mapped < 2:
            raise ValueError("max_mapped must be >= 2")
        self.max_mapped = max_mapped
        self._order: dict[Segment, None] = {}

    def __len__(self) -> int:
        return len(self._order)

    def mapped(self, seg: Segment) -> None:
        order = self._order
        order[seg] = None
        while len(order) > self.max_mapped:
            oldest = next(iter(order))
            oldest.unmap()  # removes it from `order`

    def forget(self, seg: Segment) -> None:
        self._order.pop(seg, None)


def create_segment(directory: str, base: int, capacity: int,
                   lru: MappingLru | None = None) -> Segment:
    # Create under a temporary name and rename, so a crash never leaves a short file
    # under a real segment name.
    path = os.path.join(directory, segment_name(base))
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.truncate(capacity * ENTRY_SIZE)
    os.replace(tmp, path)
    return Segment(path, base, capacity, lru)


def data_end(path: str, size: int) -> int:
    """End of the file's last data region: the sparse tail after it is all zeros.

    Lets reopen skip the never-written part of each segment instead of reading
    megabytes of zeros per queue. Falls back to `size` where holes are not reported.
    """
    fd = os.open(path, os.O_RDONLY)
    try:
        end = pos = 0
        while pos < size:
            try:
                data = os.lseek(fd, pos, os.SEEK_DATA)
            except OSError as exc:
                # ENXIO: no data after pos. Anything else: holes are not reported.
                return end if exc.errno == errno.ENXIO else size
            end = pos = os.lseek(fd, data, os.SEEK_HOLE)
        return min(end, size)
    finally:
        os.close(fd)


def last_used(mm: mmap.mmap, capacity: int, scan_end: int | None = None) -> int:
    """Entries up to and including the last non-empty one (0 when all are empty)."""
    end = capacity * ENTRY_SIZE if scan_end is None else min(scan_end, capacity * ENTRY_SIZE)
    while end > 0:
        start = max(0, end - _SCAN_CHUNK_BYTES)
        used = len(mm[start:end].rstrip(b"\0"))
        if used:
            # Walk back from the entry holding the last non-zero byte to one with a size:
            # a torn tail can leave stray bytes in an entry whose size never landed.
            i = (start + used - 1) // ENTRY_SIZE
            while i >= 0 and _entry_size(mm, i) == 0:
                i -= 1
            return i + 1
        end = start
    return 0


def first_used(mm: mmap.mmap, capacity: int) -> int:
    """Index of the first non-empty entry (`capacity` when all are empty)."""
    total = capacity * ENTRY_SIZE
    start = 0
    while start < total:
        chunk = mm[start : start + _SCAN_CHUNK_BYTES]
        skipped = len(chunk) - len(chunk.lstrip(b"\0"))
        if skipped < len(chunk):
            i = (start + skipped) // ENTRY_SIZE
            while i < capacity and _entry_size(mm, i) == 0:
                i += 1
            return i
        start += len(chunk)
    return capacity


def _entry_size(mm: mmap.mmap, i: int) -> int:
    """The `size` field of entry `i` (0: the entry is empty)."""
    _phy, size, _tag_hash = CQ_ENTRY.unpack_from(mm, i * ENTRY_SIZE)
    return int(size)
