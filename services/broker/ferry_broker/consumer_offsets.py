"""Committed consumer offsets: per (group, topic, queue_id), kept in memory and on disk.

Consumers commit the next queue offset they want to read; the broker keeps the
latest value and writes the whole table atomically (temp file, fsync, rename,
fsync of the directory) to `DATA_DIR/config/consumer_offsets.json` on an
interval when something changed, and once more at stop. A crash therefore
loses at most one interval of commits, which consumers re-read: delivery is
at least once, never a gap.

File layout (version 1):
    {"version": 1, "offsets": {"<group>": {"<topic>": {"<queue_id>": <offset>}}},
     "histories": {"<group>": {"<topic>": {"<queue_id>": "<history id>"}}}}

`histories` (issue 16; absent when empty) holds the history id of the record
before each committed offset, as the consumer sent it: a member taking the
queue over pulls with it, so a log replaced since the commit is detected.
"""
from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TypeVar

from ferry.errors import BusyError, StoreError

log = logging.getLogger(__name__)

FILE_VERSION = 1
# Entries (group, topic, queue) the table holds at most: a client committing for
# ever new names cannot grow memory and the file without bound.
MAX_ENTRIES = 1_000_000
OffsetKey = tuple[str, str, int]
#: The offsets and the history ids committed with them.
Table = tuple[dict[OffsetKey, int], dict[OffsetKey, str]]
V = TypeVar("V")


class ConsumerOffsetManager:
    """The committed-offset table and its file."""

    def __init__(self, path: Path, max_entries: int = MAX_ENTRIES) -> None:
        self._path = path
        self._max_entries = max_entries
        self._offsets: dict[OffsetKey, int] = {}
        self._hists: dict[OffsetKey, str] = {}  # history of the record before the offset
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
        self._offsets, self._hists = loaded
        log.info("loaded %d consumer offsets from %s", len(loaded), self._path)

    def commit(self, group: str, topic: str, queue_id: int, offset: int,
               hist: str | None = None) -> None:
        """Remember `offset` (and the history `hist` of the record before it); BusyError
        when it is a new entry and the table is full."""
        key = (group, topic, queue_id)
        old = self._offsets.get(key)
        if old is None and len(self._offsets) >= self._max_entries:
            raise BusyError(f"the committed-offset table is full ({self._max_entries} entries)")
        if old != offset or self._hists.get(key) != hist:
            self._offsets[key] = offset
            if hist is None:
                self._hists.pop(key, None)
            else:
                self._hists[key] = hist
            self._version += 1

    def query_hist(self, group: str, topic: str, queue_id: int) -> str | None:
        """The history id committed with the offset, None when none was."""
        return self._hists.get((group, topic, queue_id))

    def query(self, group: str, topic: str, queue_id: int) -> int:
        """The committed offset, or -1 when the group never committed for this queue."""
        return self._offsets.get((group, topic, queue_id), -1)

    def items(self) -> Iterator[tuple[OffsetKey, int]]:
        return iter(sorted(self._offsets.items()))

    def queue_floors(self) -> dict[tuple[str, int], int]:
        """Per (topic, queue_id), the smallest offset any group committed (the retention
        floor, disk.py): one pass, unsorted."""
        floors: dict[tuple[str, int], int] = {}
        for (_group, topic, queue_id), offset in self._offsets.items():
            key = (topic, queue_id)
            if offset < floors.get(key, offset + 1):
                floors[key] = offset
        return floors

    @property
    def dirty(self) -> bool:
        return self._version != self._saved_version

    def snapshot(self) -> tuple[int, Table]:
        """The table's version and a copy of it, taken on the caller's thread (cheap:
        two dict copies; serialising is left to `write_snapshot`, off the event loop)."""
        return self._version, (dict(self._offsets), dict(self._hists))

    def snapshot_bytes(self) -> bytes:
        """The table in the file's format: what a master sends its slaves (issue 9)."""
        return _encode((self._offsets, self._hists))

    def merge_snapshot(self, raw: bytes, clamp: Callable[[str, int], int]) -> int:
        """Take a master's table (`snapshot_bytes`); the number of entries changed.

        Each offset is clamped to `clamp(topic, queue_id)` (this store's max
        offset): an async slave may lag the master's log, and an offset past
        its own end would skip the messages it writes there once it is master.
        Entries only this table has (commits made here) stay.
        """
        table, hists = _decode(raw)
        changed = 0
        for (group, topic, qid), offset in table.items():
            top = clamp(topic, qid)
            key = (group, topic, qid)
            # A clamped offset's record before it is not the one the history named.
            hist = hists.get(key) if offset <= top else None
            offset = min(offset, top)
            old = self._offsets.get(key)
            if old == offset and self._hists.get(key) == hist:
                continue
            if old is None and len(self._offsets) >= self._max_entries:
                continue  # full: the master's table has the same bound, so this is rare
            self._offsets[key] = offset
            if hist is None:
                self._hists.pop(key, None)
            else:
                self._hists[key] = hist
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
                self._hists.pop((group, topic, qid), None)
                lowered += 1
        if lowered:
            self._version += 1
        return lowered

    def write_snapshot(self, version: int, table: Table) -> None:
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


def _decode(raw: bytes) -> Table:
    """A table from the file's format; StoreError when it is not that format."""
    try:
        doc = json.loads(raw)
        if doc.get("version") != FILE_VERSION:
            raise ValueError(f"unknown version {doc.get('version')!r}")
        offsets = {
            (group, topic, int(qid)): int(offset)
            for group, topics in doc["offsets"].items()
            for topic, queues in topics.items()
            for qid, offset in queues.items()
        }
        hists = {
            (group, topic, int(qid)): str(hist)
            for group, topics in doc.get("histories", {}).items()
            for topic, queues in topics.items()
            for qid, hist in queues.items()
        }
        return offsets, hists
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise StoreError(f"not a consumer-offset table: {exc}") from exc


def _nest(table: Mapping[OffsetKey, V]) -> dict[str, dict[str, dict[str, V]]]:
    nested: dict[str, dict[str, dict[str, V]]] = {}
    for (group, topic, qid), value in table.items():
        nested.setdefault(group, {}).setdefault(topic, {})[str(qid)] = value
    return nested


def _encode(table: Table) -> bytes:
    """The file content of a table: compact JSON, keys sorted."""
    offsets, hists = table
    doc: dict[str, object] = {"version": FILE_VERSION, "offsets": _nest(offsets)}
    if hists:
        doc["histories"] = _nest(hists)
    return json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()
