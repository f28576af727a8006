"""Committed consumer offsets: per (group, topic, queue_id), kept in memory and on disk.

Consumers commit the next queue offset they want to read; the broker keeps the
latest value and writes the whole table atomically (temp file, fsync, rename,
fsync of the directory) to `DATA_DIR/config/consumer_offsets.json` on an
interval when something changed, and once more at stop. A crash therefore
loses at most one interval of commits, which consumers re-read: delivery is
at least once, never a gap.

File layout (version 1):
    {"version": 1, "offsets": {"<group>": {"<topic>": {"<queue_id>": <offset>}}}}
"""
from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

from ferry.errors import BusyError, StoreError

log = logging.getLogger(__name__)

FILE_VERSION = 1
# Entries (group, topic, queue) the table holds at most: a client committing for
# ever new names cannot grow memory and the file without bound.
MAX_ENTRIES = 1_000_000
OffsetKey = tuple[str, str, int]


class ConsumerOffsetManager:
    """The committed-offset table and its file."""

    def __init__(self, path: Path, max_entries: int = MAX_ENTRIES) -> None:
        self._path = path
        self._max_entries = max_entries
        self._offsets: dict[OffsetKey, int] = {}
        self._version = 0  # bumped on every change; the file holds `_saved_version`
        self._saved_version = 0
        # Saves run in a worker thread; one at a time, and the newest snapshot wins.
        self._save_lock = threading.Lock()

    @property
    def path(self) -> Path:
        return self._path

    def load(self) -> None:
        """Read the file if it exists; a missing file is an empty table."""
        try:
            raw = self._path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return
        try:
            loaded = _decode(raw.encode())
        except StoreError as exc:
            raise StoreError(f"cannot read consumer offsets from {self._path}: {exc}") from exc
        self._offsets = loaded
        log.info("loaded %d consumer offsets from %s", len(loaded), self._path)

    def commit(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        """Remember `offset`; BusyError when it is a new entry and the table is full."""
        key = (group, topic, queue_id)
        old = self._offsets.get(key)
        if old is None and len(self._offsets) >= self._max_entries:
            raise BusyError(f"the committed-offset table is full ({self._max_entries} entries)")
        if old != offset:
            self._offsets[key] = offset
            self._version += 1

    def query(self, group: str, topic: str, queue_id: int) -> int:
        """The committed offset, or -1 when the group never committed for this queue."""
        return self._offsets.get((group, topic, queue_id), -1)

    def items(self) -> Iterator[tuple[OffsetKey, int]]:
        return iter(sorted(self._offsets.items()))

    @property
    def dirty(self) -> bool:
        return self._version != self._saved_version

    def snapshot(self) -> tuple[int, dict[OffsetKey, int]]:
        """The table's version and a copy of it, taken on the caller's thread (cheap:
        one dict copy; serialising is left to `write_snapshot`, off the event loop)."""
        return self._version, dict(self._offsets)

    def snapshot_bytes(self) -> bytes:
        """The table in the file's format: what a master sends its slaves (issue 9)."""
        return _encode(self._offsets)

    def merge_snapshot(self, raw: bytes, clamp: Callable[[str, int], int]) -> int:
        """Take a master's table (`snapshot_bytes`); the number of entries changed.

        Each offset is clamped to `clamp(topic, queue_id)` (this store's max
        offset): an async slave may lag the master's log, and an offset past
        its own end would skip the messages it writes there once it is master.
        Entries only this table has (commits made here) stay.
        """
        table = _decode(raw)
        changed = 0
        for (group, topic, qid), offset in table.items():
            offset = min(offset, clamp(topic, qid))
            key = (group, topic, qid)
            old = self._offsets.get(key)
            if old == offset:
                continue
            if old is None and len(self._offsets) >= self._max_entries:
                continue  # full: the master's table has the same bound, so this is rare
            self._offsets[key] = offset
            changed += 1
        if changed:
            self._version += 1
        return changed

    def clamp(self, limit: Callable[[str, int], int]) -> int:
        """Lower every offset past `limit(topic, queue_id)` (this store's max offset) to it;
        the number lowered. A member whose log was truncated (it rejoined a new master)
        must not keep offsets past its own queue ends when it leads again: consumers
        would skip what it then writes there."""
        lowered = 0
        for (group, topic, qid), offset in list(self._offsets.items()):
            top = limit(topic, qid)
            if offset > top:
                self._offsets[(group, topic, qid)] = top
                lowered += 1
        if lowered:
            self._version += 1
        return lowered

    def write_snapshot(self, version: int, table: dict[OffsetKey, int]) -> None:
        """Serialise and write a snapshot atomically; safe to call from a worker thread."""
        with self._save_lock:
            if version <= self._saved_version:
                return  # a newer snapshot is already on disk
            content = _encode(table)
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


def _decode(raw: bytes) -> dict[OffsetKey, int]:
    """A table from the file's format; StoreError when it is not that format."""
    try:
        doc = json.loads(raw)
        if doc.get("version") != FILE_VERSION:
            raise ValueError(f"unknown version {doc.get('version')!r}")
        return {
            (group, topic, int(qid)): int(offset)
            for group, topics in doc["offsets"].items()
            for topic, queues in topics.items()
            for qid, offset in queues.items()
        }
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise StoreError(f"not a consumer-offset table: {exc}") from exc


def _encode(table: dict[OffsetKey, int]) -> bytes:
    """The file content of a table: compact JSON, keys sorted."""
    nested: dict[str, dict[str, dict[str, int]]] = {}
    for (group, topic, qid), offset in table.items():
        nested.setdefault(group, {}).setdefault(topic, {})[str(qid)] = offset
    doc = {"version": FILE_VERSION, "offsets": nested}
    return json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()
