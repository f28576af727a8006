"""Committed consumer offsets: per (group, topic, queue_id), kept in memory and on disk.

Consumers commit the next queue offset they want to read; the broker keeps the
latest value and writes the whole table atomically (temp file, fsync, rename,
fsync of the directory) to `DATA_DIR/config/consumer_offsets.json` on an
interval when something changed, and once more at stop. A crash therefore
loses at most one interval of commits, which consumers re-read: delivery is
at least once, never a gap. The formats are in `offsets_codec`.

Bounds (issue 24): the table holds at most `max_entries` entries (a new one
beyond it is BusyError), and with auth on the commits of one identity create at
most `max_per_identity` of them (then AccessDeniedError): one identity cannot
fill the table and lock every other group out.

The table is ordered by last change, each entry stamped with the table version
of that change: `changes_since(v)` walks back from the newest only as far as
the changes a slave has not been sent (replication/master.py).
"""
from __future__ import annotations

import logging
import os
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

from ferry.errors import AccessDeniedError, BusyError, StoreError

from ferry_broker.offsets_codec import (
    Entry,
    OffsetKey,
    Table,
    decode_changes,
    decode_file,
    encode_batches,
    encode_file,
)

log = logging.getLogger(__name__)

# Entries (group, topic, queue) the table holds at most: a client committing for
# ever new names cannot grow memory and the file without bound.
MAX_ENTRIES = 1_000_000
#: Entries the commits of one identity may create (auth on): a tenth of the table.
MAX_PER_IDENTITY = 100_000


class ConsumerOffsetManager:
    """The committed-offset table and its file."""

    def __init__(self, path: Path, max_entries: int = MAX_ENTRIES,
                 max_per_identity: int = MAX_PER_IDENTITY) -> None:
        self._path = path
        self._max_entries = max_entries
        self._max_per_identity = max_per_identity
        self._entries: Table = {}  # oldest change first
        self._created: Counter[str] = Counter()  # entries each identity's commits created
        self._version = 0  # bumped on every change; the file holds `_saved_version`
        self._saved_version = 0
        # Saves run in a worker thread; one at a time, and the newest snapshot wins.
        self._save_lock = threading.Lock()

    @property
    def path(self) -> Path:
        return self._path

    @property
    def version(self) -> int:
        """Bumped by every change: a slave link compares it with what it sent."""
        return self._version

    def load(self) -> None:
        """Read the file if it exists; a missing file is an empty table."""
        try:
            raw = self._path.read_bytes()
        except FileNotFoundError:
            return
        try:
            self._entries = decode_file(raw)
        except StoreError as exc:
            raise StoreError(f"cannot read consumer offsets from {self._path}: {exc}") from exc
        self._created = Counter(e.owner for e in self._entries.values() if e.owner is not None)
        log.info("loaded %d consumer offsets from %s", len(self._entries), self._path)

    def commit(self, group: str, topic: str, queue_id: int, offset: int,
               hist: str | None = None, identity: str | None = None) -> None:
        """Remember `offset` (and the history `hist` of the record before it).

        A new entry: BusyError when the table is full, AccessDeniedError when
        `identity` (None with auth off) created its limit of entries already."""
        key = (group, topic, queue_id)
        old = self._entries.get(key)
        if old is None:
            if len(self._entries) >= self._max_entries:
                raise BusyError(f"the committed-offset table is full ({self._max_entries} "
                                "entries)")
            if identity is not None:
                if self._created[identity] >= self._max_per_identity:
                    raise AccessDeniedError(
                        f"access denied: {identity!r} has created {self._max_per_identity} "
                        "committed-offset entries on this broker, its limit "
                        "(FERRY_BROKER_OFFSETS_MAX_PER_IDENTITY)")
                self._created[identity] += 1
            self._put(key, offset, hist, identity)
        elif old.offset != offset or old.hist != hist:
            self._put(key, offset, hist, old.owner)

    def _put(self, key: OffsetKey, offset: int, hist: str | None, owner: str | None) -> None:
        """Store a changed entry at the end of the change order, with a new version."""
        self._version += 1
        self._entries.pop(key, None)
        self._entries[key] = Entry(offset, hist, owner, self._version)

    def query_hist(self, group: str, topic: str, queue_id: int) -> str | None:
        """The history id committed with the offset, None when none was."""
        entry = self._entries.get((group, topic, queue_id))
        return entry.hist if entry is not None else None

    def query(self, group: str, topic: str, queue_id: int) -> int:
        """The committed offset, or -1 when the group never committed for this queue."""
        entry = self._entries.get((group, topic, queue_id))
        return entry.offset if entry is not None else -1

    def items(self) -> Iterator[tuple[OffsetKey, int]]:
        return iter(sorted((k, e.offset) for k, e in self._entries.items()))

    def created_by(self, identity: str) -> int:
        """How many entries the commits of `identity` created."""
        return self._created[identity]

    def queue_floors(self) -> dict[tuple[str, int], int]:
        """Per (topic, queue_id), the smallest offset any group committed (the retention
        floor, disk.py): one pass, unsorted."""
        floors: dict[tuple[str, int], int] = {}
        for (_group, topic, queue_id), entry in self._entries.items():
            key = (topic, queue_id)
            if entry.offset < floors.get(key, entry.offset + 1):
                floors[key] = entry.offset
        return floors

    @property
    def dirty(self) -> bool:
        return self._version != self._saved_version

    def snapshot(self) -> tuple[int, Table]:
        """The table's version and a copy of it, taken on the caller's thread (cheap:
        one dict copy of immutable entries; serialising is left to `write_snapshot`,
        off the event loop)."""
        return self._version, dict(self._entries)

    # -- replication (issue 24: batches of changes, not the whole table each second) -----

    def changes_since(self, version: int) -> tuple[int, list[tuple[OffsetKey, Entry]]]:
        """The table's version and every entry changed after `version` (all of them for
        a negative one), newest first; on the loop, O(changes) (a full copy is one C-level
        list of immutable entries). Encode them with `encode_changes`, in a thread."""
        if version < 0:
            return self._version, list(self._entries.items())
        out = []
        for key, entry in reversed(self._entries.items()):
            if entry.version <= version:
                break
            out.append((key, entry))
        return self._version, out

    @staticmethod
    def encode_changes(changes: list[tuple[OffsetKey, Entry]], max_bytes: int) -> list[bytes]:
        """OFFSETS payloads for `changes`, each under `max_bytes` (thread-safe: pure)."""
        return encode_batches(changes, max_bytes)

    def merge_snapshot(self, raw: bytes, clamp: Callable[[str, int], int]) -> int:
        """Take one OFFSETS payload of a master (a batch of entries, or a whole table from
        a master before issue 24); the number of entries changed.

        Each offset is clamped to `clamp(topic, queue_id)` (this store's max
        offset): an async slave may lag the master's log, and an offset past
        its own end would skip the messages it writes there once it is master.
        Entries only this table has (commits made here) stay.
        """
        changed = 0
        for key, offset, hist, owner in decode_changes(raw):
            top = clamp(key[1], key[2])
            # A clamped offset's record before it is not the one the history named.
            if offset > top:
                offset, hist = top, None
            old = self._entries.get(key)
            if old is not None and old.offset == offset and old.hist == hist:
                continue
            if old is None:
                if len(self._entries) >= self._max_entries:
                    continue  # full: the master's table has the same bound, so this is rare
                if owner is not None:
                    self._created[owner] += 1
            self._put(key, offset, hist, owner if old is None else old.owner)
            changed += 1
        return changed

    def clamp(self, limit: Callable[[str, int], int]) -> int:
        """Lower every offset past `limit(topic, queue_id)` (this store's max offset) to it;
        the number lowered. A member whose log was truncated (it rejoined a new master)
        must not keep offsets past its own queue ends when it leads again: consumers
        would skip what it then writes there."""
        lowered = 0
        for key, entry in list(self._entries.items()):
            top = limit(key[1], key[2])
            if entry.offset > top:
                self._put(key, top, None, entry.owner)
                lowered += 1
        return lowered

    # -- the file ---------------------------------------------------------------------------

    def write_snapshot(self, version: int, table: Table) -> None:
        """Serialise and write a snapshot atomically; safe to call from a worker thread."""
        with self._save_lock:
            if version <= self._saved_version:
                return  # a newer snapshot is already on disk
            content = encode_file(table)
            self._path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self._path.with_suffix(".json.tmp")
            with open(tmp, "wb") as f:
                f.write(content)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self._path)
            dir_fd = os.open(self._path.parent, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
            self._saved_version = version

    def save(self) -> None:
        """Snapshot and write now, on this thread (used at stop and in tests)."""
        if self.dirty:
            self.write_snapshot(*self.snapshot())
