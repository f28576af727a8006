"""Index files: an on-disk hash from message keys and ids to commit-log offsets.

`query_by_key` and `query_by_id` need "which records carry key K" without scanning
the log. Each index file is a fixed-size, memory-mapped hash table in the RocketMQ
IndexFile tradition:

    header (INDEX_HEADER, 64 bytes) | slot table (INDEX_SLOT x slot_count) | entries (INDEX_ENTRY x capacity)

A key hashes (CRC32C) to a slot; the slot holds the 1-based number of the newest
entry with that slot, and every entry holds the number of the previous one, so a
slot is the head of a chain walked newest first. Entries are appended in commit-log
order, which makes "drop everything from phy P on" a suffix cut. A file is full at
`capacity` entries, or when a timestamp no longer fits the entry's i32 millisecond
delta from the file's base time (about 24.8 days); then the service rolls to a new file:

    <root>/index/<20-digit timestamp ms of the file's first entry>

(bumped to stay unique and increasing). Files are created sparse at full size.
Byte layout: docs/store-format.md.
"""
from __future__ import annotations

import mmap
import os
import struct
import sys
from itertools import islice

from ferry.errors import StoreError

from .index_keys import IndexItem, key_hash

#   0 magic b"FIDX" | 4 version u16 | 6 reserved u16 | 8 base_ts_ms i64 (deltas count from it)
#  16 begin_ts_ms i64 | 24 end_ts_ms i64 (min/max store time indexed)
#  32 begin_phy i64 | 40 end_phy i64 (first/last phy indexed, -1 when empty)
#  48 slot_count u32 | 52 capacity u32 (entries) | 56 entry_count u32 | 60 reserved u32
INDEX_HEADER = struct.Struct("<4sHHqqqqqIIII")
# One u32 per slot: 1-based number of the newest entry hashed there, 0 = none.
INDEX_SLOT = struct.Struct("<I")
#   0 key_hash u32 | 4 phy_offset i64 | 12 time_delta_ms i32 (store ts - base_ts_ms)
#  16 prev u32 (1-based number of the previous entry in this slot's chain, 0 = end)
INDEX_ENTRY = struct.Struct("<IqiI")
INDEX_MAGIC = b"FIDX"
INDEX_VERSION = 1
NAME_DIGITS = 20
_DELTA_MIN = -(1 << 31)
_DELTA_MAX = (1 << 31) - 1
_MAX_U32 = (1 << 32) - 1
# Entries one query walks per file at most (a chain holds every key hashed to its slot).
MAX_CHAIN_STEPS = 65_536

if sys.byteorder != "little":  # the slot table is read through a native memoryview
    raise ImportError("ferry.store.index_file needs a little-endian host")


class IndexFile:
    """One memory-mapped index file: add entries in phy order, walk chains."""

    def __init__(self, path: str) -> None:
        self.path = path
        size = os.path.getsize(path)
        with open(path, "r+b") as f:
            if size < INDEX_HEADER.size:
                raise StoreError(f"index file {path} is too short ({size} bytes)")
            self._mm = mmap.mmap(f.fileno(), size)
        (magic, version, _, self.base_ts_ms, self.begin_ts_ms, self.end_ts_ms, self.begin_phy,
         self.end_phy, self.slot_count, self.capacity, self.count, _) = INDEX_HEADER.unpack_from(self._mm, 0)
        want = INDEX_HEADER.size + self.slot_count * INDEX_SLOT.size + self.capacity * INDEX_ENTRY.size
        if magic != INDEX_MAGIC or version != INDEX_VERSION or self.slot_count == 0 or size != want:
            self._mm.close()
            raise StoreError(f"index file {path} has a bad header (magic {magic!r}, version {version})")
        self._entries_at = INDEX_HEADER.size + self.slot_count * INDEX_SLOT.size
        self._view = memoryview(self._mm)
        self._slots = self._view[INDEX_HEADER.size : self._entries_at].cast("I")
        self.dirty = False
        self._recover_count()

    @classmethod
    def create(cls, path: str, slot_count: int, capacity: int, base_ts_ms: int) -> IndexFile:
        """Create a sparse file of full size with its header, then open it."""
        size = INDEX_HEADER.size + slot_count * INDEX_SLOT.size + capacity * INDEX_ENTRY.size
        tmp = path + ".tmp"
        with open(tmp, "wb") as f:
            f.truncate(size)
            f.write(INDEX_HEADER.pack(INDEX_MAGIC, INDEX_VERSION, 0, base_ts_ms, base_ts_ms, base_ts_ms,
                                      -1, -1, slot_count, capacity, 0, 0))
        os.replace(tmp, path)  # a crash never leaves a headerless file under a real name
        return cls(path)

    def _recover_count(self) -> None:
        # The header is rewritten on flush, so after a crash entries (and slots) may
        # run past its count: take every non-zero entry that follows.
        n = self.count
        while n < self.capacity:
            h, phy, delta, prev = INDEX_ENTRY.unpack_from(self._mm, self._entries_at + n * INDEX_ENTRY.size)
            if not (h or phy or delta or prev):
                break
            if self.begin_phy < 0:
                self.begin_phy = phy
            self.end_phy = phy
            ts = self.base_ts_ms + delta
            self.begin_ts_ms = min(self.begin_ts_ms, ts)
            self.end_ts_ms = max(self.end_ts_ms, ts)
            n += 1
        if n != self.count:
            self.count = n
            self.write_header()

    @property
    def full(self) -> bool:
        return self.count >= self.capacity

    def write_header(self) -> None:
        INDEX_HEADER.pack_into(self._mm, 0, INDEX_MAGIC, INDEX_VERSION, 0, self.base_ts_ms,
                               self.begin_ts_ms, self.end_ts_ms, self.begin_phy, self.end_phy,
                               self.slot_count, self.capacity, self.count, 0)
        self.dirty = True

    def add_many(self, items: list[tuple[int, int, int]], start: int, floor_phy: int) -> int:
        """Add (key hash, phy, ts) items[start:] until the file is full or a timestamp does not fit.

        Items whose phy is <= `floor_phy` are skipped (already indexed; items come in
        commit-log order, so they are a prefix). Returns the index of the first item
        not consumed.
        """
        total = len(items)
        while start < total and items[start][1] <= floor_phy:
            start += 1
        slots, nslots, base, mm = self._slots, self.slot_count, self.base_ts_ms, self._mm
        n0 = n = self.count
        lo_d, hi_d = self.begin_ts_ms - base, self.end_ts_ms - base
        pack_into, dmin, dmax = INDEX_ENTRY.pack_into, _DELTA_MIN, _DELTA_MAX
        esize = INDEX_ENTRY.size
        at = self._entries_at + n * esize
        last_ts: int | None = None
        d = 0
        # The hot loop of every put: locals only, no bounds checks (the slice stops at
        # the file's capacity), entries packed straight into the mapping, and the time
        # checks run only when the timestamp changes (a batch usually shares one).
        for h, p, ts in islice(items, start, start + self.capacity - n0):
            if ts != last_ts:
                d = ts - base
                if d < dmin or d > dmax:
                    break
                if d < lo_d:
                    lo_d = d
                if d > hi_d:
                    hi_d = d
                last_ts = ts
            s = h % nslots
            pack_into(mm, at, h, p, d, slots[s])
            at += esize
            n += 1
            slots[s] = n
        stop = start + n - n0
        if n != n0:
            if self.begin_phy < 0:
                self.begin_phy = INDEX_ENTRY.unpack_from(mm, self._entries_at)[1]
            self.count, self.end_phy = n, items[stop - 1][1]
            self.begin_ts_ms, self.end_ts_ms = base + lo_d, base + hi_d
            # The header is written on flush, roll and close; reopen recounts the
            # entries written after it (see _recover_count).
            self.dirty = True
        return stop

    def overlaps(self, begin_ms: int, end_ms: int) -> bool:
        return self.count > 0 and self.begin_ts_ms <= end_ms and self.end_ts_ms >= begin_ms

    def query(self, h: int, begin_ms: int, end_ms: int, max_count: int, out: list[int], seen: set[int]) -> None:
        """Append to `out` the phy offsets whose entry has hash `h` and time in the window."""
        idx = self._slots[h % self.slot_count]
        unpack, at, base, count = INDEX_ENTRY.unpack_from, self._entries_at, self.base_ts_ms, self.count
        steps = MAX_CHAIN_STEPS  # a long chain of colliding keys must not stall the store
        while 0 < idx <= count and len(out) < max_count and steps:
            eh, phy, delta, prev = unpack(self._mm, at + (idx - 1) * INDEX_ENTRY.size)
            ts = base + delta
            if ts < begin_ms:
                break  # chains run newest first and store times never decrease: all older
            if eh == h and ts <= end_ms and phy not in seen:
                seen.add(phy)
                out.append(phy)
            if prev >= idx:  # chains only point backwards; anything else is damage
                break
            idx = prev
            steps -= 1

    def truncate_from_phy(self, phy_offset: int) -> None:
        """Remove the suffix of entries whose phy is >= phy_offset, restoring their slots."""
        n = self.count
        at, size = self._entries_at, INDEX_ENTRY.size
        while n > 0:
            h, phy, _, prev = INDEX_ENTRY.unpack_from(self._mm, at + (n - 1) * size)
            if phy < phy_offset:
                break
            s = h % self.slot_count
            if self._slots[s] == n:  # newest first, so each slot gets back its previous head
                self._slots[s] = prev
            n -= 1
        if n == self.count:
            return
        self._mm[at + n * size : at + self.count * size] = bytes((self.count - n) * size)
        self.count = n
        self.end_phy = INDEX_ENTRY.unpack_from(self._mm, at + (n - 1) * size)[1] if n else -1
        if n == 0:
            self.begin_phy = -1
        self.write_header()

    def flush(self) -> None:
        if self.dirty:
            self.write_header()
            self._mm.flush()
            self.dirty = False

    def close(self) -> None:
        self.flush()
        self._slots.release()
        self._view.release()
        self._mm.close()


class IndexService:
    """All index files under `<root_dir>/index`: put keys, query them, recover, retain."""

    def __init__(self, root_dir: str, max_slots: int = 5_000_000, max_entries: int = 20_000_000) -> None:
        if not (0 < max_slots <= _MAX_U32 and 0 < max_entries < _MAX_U32):
            raise StoreError(f"bad index sizes: max_slots={max_slots}, max_entries={max_entries}")
        self.max_slots = max_slots
        self.max_entries = max_entries
        self._dir = os.path.join(root_dir, "index")
        os.makedirs(self._dir, exist_ok=True)
        self._files: list[IndexFile] = []
        self._new_dirs: set[str] = set()  # fsynced by the next checkpoint
        self._load()
        self._last_phy = self._find_last_phy()
        # After a put that failed part way: the floor for the next put_hashed, so the
        # remaining keys of the last record indexed are not taken as already indexed.
        self._resume_floor: int | None = None

    def _load(self) -> None:
        names = sorted(n for n in os.listdir(self._dir) if len(n) == NAME_DIGITS and n.isdigit())
        for name in os.listdir(self._dir):
            if name.endswith(".tmp"):
                os.remove(os.path.join(self._dir, name))
        for i, name in enumerate(names):
            path = os.path.join(self._dir, name)
            try:
                self._files.append(IndexFile(path))
            except StoreError:
                if i != len(names) - 1:
                    raise
                os.remove(path)  # a torn newest file: recovery re-dispatches what it held

    @property
    def last_phy_offset(self) -> int:
        """The highest phy offset indexed so far, -1 when empty."""
        return self._last_phy

    def _find_last_phy(self) -> int:
        for f in reversed(self._files):
            if f.count:
                return f.end_phy
        return -1

    def _roll(self, ts_ms: int) -> IndexFile:
        name_ts = ts_ms
        if self._files:
            newest = self._files[-1]
            newest.flush()
            name_ts = max(ts_ms, int(os.path.basename(newest.path)) + 1)
        path = os.path.join(self._dir, f"{max(name_ts, 0):0{NAME_DIGITS}d}")
        f = IndexFile.create(path, self.max_slots, self.max_entries, ts_ms)
        self._new_dirs.add(self._dir)
        self._files.append(f)
        return f

    def put_hashed(self, items: list[IndexItem]) -> None:
        """Index (key_hash(key), phy_offset, store_ts_ms) items, given in commit-log order.

        Items at or below the last phy indexed before this call are skipped, so
        recovery can re-dispatch over already indexed records without duplicates
        (a record's keys always arrive in one call). Writers hash keys as they encode
        (index_keys.py: no key bytes are built per message).
        On failure (an I/O error rolling to a new file) the items applied are removed
        from `items`, so calling again with the same list applies exactly the rest.
        """
        floor = self._last_phy if self._resume_floor is None else self._resume_floor
        self._put(items, floor)

    def _put(self, items: list[tuple[int, int, int]], floor_phy: int) -> None:
        i, total = 0, len(items)
        try:
            while i < total:
                f = self._files[-1] if self._files else None
                if f is None or f.full:
                    f = self._roll(items[i][2])
                j = f.add_many(items, i, floor_phy)
                if f.count:
                    self._last_phy = f.end_phy
                i = j
                if j < total and not f.full:
                    self._roll(items[j][2])  # the timestamp does not fit this file's delta range
        except BaseException:
            if i:
                last = items[i - 1][1]
                self._resume_floor = floor_phy if last <= floor_phy else last - 1
                del items[:i]
            raise
        self._resume_floor = None

    def query(self, key: bytes, begin_ms: int, end_ms: int, max_count: int) -> list[int]:
        """Candidate phy offsets for `key` stored in [begin_ms, end_ms], newest first.

        Different keys can share a hash, so the caller verifies each record's keys.
        """
        out: list[int] = []
        seen: set[int] = set()
        h = key_hash(key)
        for f in reversed(self._files):
            if len(out) >= max_count:
                break
            if f.overlaps(begin_ms, end_ms):
                f.query(h, begin_ms, end_ms, max_count, out, seen)
        return out

    def drop_from(self, phy_offset: int) -> None:
        """Remove every entry whose phy is >= `phy_offset`."""
        while self._files:
            f = self._files[-1]
            if f.count and f.begin_phy < phy_offset:
                f.truncate_from_phy(phy_offset)
                break
            self._files.pop()
            f.close()
            os.remove(f.path)
        self._last_phy = self._find_last_phy()

    def truncate_from_phy(self, phy_offset: int) -> int:
        """Recovery: make sure no entry at or past `phy_offset` remains.

        Also drops the newest remaining record's entries, whose keys may be only partly
        indexed, and returns that record's phy offset: the caller re-dispatches the
        log from there. Returns 0 when nothing remains (re-dispatch everything).
        """
        self.drop_from(phy_offset)
        last = self.last_phy_offset
        if last < 0:
            return 0
        self.drop_from(last)
        return last

    def delete_below_phy(self, min_phy: int) -> int:
        """Retention: delete the files whose entries all point below `min_phy`.

        The newest file is always kept. Returns the number of files deleted.
        """
        deleted = 0
        while len(self._files) > 1 and self._files[0].end_phy < min_phy:
            f = self._files.pop(0)
            f.close()
            os.remove(f.path)
            deleted += 1
        return deleted

    def flush(self) -> None:
        for f in self._files:
            f.flush()

    def take_new_dirs(self) -> set[str]:
        """Directories that got new files since the last call (see ConsumeQueues)."""
        dirs, self._new_dirs = self._new_dirs, set()
        return dirs

    def take_dirty(self) -> list[str]:
        """Paths of the files written since the last call, headers updated, marked clean.

        The caller fdatasyncs them later (see ConsumeQueues.take_dirty for why by path).
        """
        out: list[str] = []
        for f in self._files:
            if f.dirty:
                f.write_header()
                f.dirty = False
                out.append(f.path)
        return out

    def close(self) -> None:
        for f in self._files:
            f.close()
        self._files.clear()
