"""Queue histories: which stored records continue what a reader saw (issue 16).

A history is a stretch of the commit log written as one continuation. A reader
(a consumer's fetcher) remembers the history of the last record it took; when
the broker's log is no longer the continuation of that history (the store
started again on an empty directory, recovery cut its tail, a new master with
a shorter log took over), the reader's position may point past records it never
saw. Comparing histories finds the exact offset where the logs part, and the
reader moves back there: duplicates, never a gap (Kafka's KIP-320 does the same
with leader epochs).

History ids (strings, short on the wire):

- ``E<epoch>``: records written in a master term of issue 9's epoch log. Every
  replica of a broker group holds the same epoch list and the same bytes, so
  the id is the same on the master and its slaves, across failovers.
- ``L<16 hex>``: records written before the store's first epoch (a broker
  without replication): a local run. A new run, with a random id, starts when
  the store opens on an empty directory (a lost disk), when its history file
  is missing (a store from before issue 16), and after every unclean open
  (recovery may have cut the tail that readers saw).

The boundaries are commit-log offsets. A queue's boundaries are the first queue
offset whose record lies at or after each (a binary search of its consume
queue, cached per queue): nothing is stored per record, and a PULL costs a
bisect. The local runs live in ``<root>/histories`` (an `entry_file`), rewritten
whole::

    magic u32 HISTORIES.magic | version u32 | count u32 | created_ms i64
    | count x (run_id u64, start_offset i64) | crc u32 (CRC32C of every byte before it)

`created_ms` is when the store started on an empty directory (0: a store from
before issue 16): the broker's committed-offset table is no older than that, so
a group older than it that has no offset there lost it (or never read there).
"""
from __future__ import annotations

import bisect
import os
import struct
import time
from typing import TYPE_CHECKING

from ferry.errors import StoreError

from .entry_file import EntryFile, load_entries, save_entries

if TYPE_CHECKING:
    from .consume_queue import ConsumeQueue
    from .epochs import EpochLog

#: magic b"FRYH", head field created_ms; at most one run per unclean open or empty start.
HISTORIES = EntryFile("histories", "history file", 0x48595246, 1, struct.Struct("<IIIq"),
                      struct.Struct("<Qq"), 100_000)
#: Longest history id a request may carry ("L" + 16 hex; "E" + a 63-bit epoch).
MAX_HISTORY_ID_CHARS = 32

Run = tuple[int, int]  # (run_id, start_offset)


def local_id(run_id: int) -> str:
    return f"L{run_id:016x}"


def epoch_id(epoch: int) -> str:
    return f"E{epoch}"


class QueueHistory:
    """The histories of one queue: ids and their first queue offsets, oldest first."""

    __slots__ = ("ids", "starts", "_index")

    def __init__(self, ids: list[str], starts: list[int]) -> None:
        self.ids = ids
        self.starts = starts   # non-decreasing; a history empty in this queue shares its start
        self._index = {h: i for i, h in enumerate(ids)}

    def id_at(self, queue_offset: int) -> str | None:
        """The history of the record at `queue_offset` (None before the first one)."""
        i = bisect.bisect_right(self.starts, queue_offset) - 1
        return self.ids[i] if i >= 0 else None

    def end_of_history_at(self, queue_offset: int) -> int | None:
        """Where the history holding `queue_offset` ends in this queue (None: still open)."""
        i = bisect.bisect_right(self.starts, queue_offset)
        return self.starts[i] if i < len(self.starts) else None

    def divergence(self, hist: str, offset: int, min_offset: int, max_offset: int) -> int | None:
        """Where a reader at `offset`, whose last record was in `hist`, must go back to, or None.

        None also when this replica has not caught up with the reader (it may serve it
        later): `hist` is the newest history here and `offset` lies past `max_offset`
        (a slave behind), or `hist` is an epoch newer than every epoch here (a slave or
        a rejoining old master that has not synced that term yet).

        A known `hist`: its end here, when `offset` lies past it (records written
        after it replaced what the reader saw). A local run unknown here while this
        replica has epochs: records written before the first epoch (each replica names
        its own runs), so it ends where the first epoch begins. Any other unknown
        `hist` (the broker lost that history: a new disk): the start of the oldest
        history still stored. Duplicates rather than a gap: when unsure, go back.
        """
        i = self._index.get(hist)
        if i is None:
            return self._unknown(hist, offset, min_offset)
        if i + 1 == len(self.ids):
            return None   # the open history: past its end is "not yet here", not a gap
        end = self.starts[i + 1]
        return end if offset > end else None

    def _unknown(self, hist: str, offset: int, min_offset: int) -> int | None:
        """`divergence` for an id not in this queue's list."""
        oldest = max(self.starts[0] if self.starts else 0, min_offset)
        epoch = _epoch_of(hist)
        first_e = next((j for j, h in enumerate(self.ids) if h.startswith("E")), None)
        if first_e is None:
            return oldest   # no epochs here: a local history this store never had (lost)
        if epoch is not None:
            newest = max(e for h in self.ids if (e := _epoch_of(h)) is not None)
            if epoch > newest:
                return None   # a term this replica has not synced yet: not caught up
            return oldest     # an older term this replica never had: lost here
        # A local run of another replica (or an older disk): the pre-epoch records.
        end = max(self.starts[first_e], min_offset)
        return end if offset > end else None


def _epoch_of(hist: str) -> int | None:
    """The epoch of an ``E<n>`` id, None for anything else."""
    if hist.startswith("E") and hist[1:].isdigit():
        return int(hist[1:])
    return None


class StoreHistories:
    """The store's history boundaries and the per-queue view of them (cached)."""

    def __init__(self, root_dir: str, write_offset: int, clean: bool) -> None:
        self.path = os.path.join(root_dir, HISTORIES.name)
        self._runs, self.created_ms = _load(self.path)
        if not self._runs and write_offset == 0:
            self.created_ms = int(time.time() * 1000)   # an empty store: a new history
        self._epochs: EpochLog | None = None
        self._key: object = None
        self._bounds: list[tuple[str, int]] = []
        self._queues: dict[tuple[str, int], QueueHistory] = {}
        if not self._runs or not clean:
            self.start_run(write_offset)

    @property
    def runs(self) -> list[Run]:
        return list(self._runs)

    def start_run(self, write_offset: int) -> None:
        """Begin a new local run at the log end `write_offset` (durable when it returns)."""
        runs = [r for r in self._runs if r[1] < write_offset]
        runs.append((int.from_bytes(os.urandom(8), "little"), write_offset))
        if len(runs) > HISTORIES.max_entries:
            runs = runs[-HISTORIES.max_entries:]
        _save(self.path, runs, self.created_ms)
        self._runs = runs
        self._key = None

    def use_epochs(self, epochs: EpochLog) -> None:
        """Take boundaries from this epoch log too (a replicating broker's, issue 9)."""
        self._epochs = epochs
        self._key = None

    def invalidate(self) -> None:
        """Forget the per-queue views (the log was truncated: queue offsets moved)."""
        self._key = None

    def boundaries(self) -> list[tuple[str, int]]:
        """(history id, commit-log start), oldest first: local runs before the first epoch,
        then the epochs."""
        epochs = self._epochs.entries if self._epochs is not None else []
        key = (len(self._runs), self._runs[-1] if self._runs else None, tuple(epochs))
        if key != self._key:
            first_epoch = epochs[0][1] if epochs else 2**63
            bounds = [(local_id(r), s) for r, s in self._runs if s < first_epoch]
            bounds += [(epoch_id(e), s) for e, s in epochs]
            self._bounds, self._queues, self._key = bounds, {}, key
        return self._bounds

    def of_queue(self, cq: ConsumeQueue) -> QueueHistory:
        """The queue's histories (`cq` dispatched up to the log end); cached, since a
        boundary's first queue offset never moves: a boundary is the log end when it is
        made, so every record appended later lies at or after it, and a boundary with no
        record of this queue yet maps to its next offset, which the next record takes.
        Only a truncation (`invalidate`) or a new boundary changes them."""
        bounds = self.boundaries()
        key = (cq.topic, cq.queue_id)
        qh = self._queues.get(key)
        if qh is None:
            qh = self._queues[key] = _map_queue(cq, bounds)
        return qh


def _map_queue(cq: ConsumeQueue, bounds: list[tuple[str, int]]) -> QueueHistory:
    lo, hi = cq.min_offset, cq.max_offset
    starts: list[int] = []
    for i, (_hid, phy) in enumerate(bounds):
        if i == 0:
            starts.append(0)   # the oldest history holds everything before the next one
            continue
        lo = cq.first_offset_at_phy(max(lo, starts[-1], cq.min_offset), hi, phy)
        starts.append(lo)
    return QueueHistory([h for h, _ in bounds], starts)


def _save(path: str, runs: list[Run], created_ms: int) -> None:
    save_entries(HISTORIES, path, (created_ms,), runs)


def _load(path: str) -> tuple[list[Run], int]:
    """The runs of the history file at `path` and its created_ms (([], 0) when none)."""
    got = load_entries(HISTORIES, path)
    if got is None:
        return [], 0
    head, runs = got
    if any(b[1] <= a[1] for a, b in zip(runs, runs[1:], strict=False)):
        raise StoreError(f"history file {path} holds runs out of order")
    return runs, int(head[3])
