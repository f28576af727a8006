"""The timing wheel: which message of the local log is due when, memory-bounded.

Every message the scheduler holds is one record of its local log (its
`phy_offset` names it) and one entry (due_ms, phy_offset) in the bucket file
of its due time (`wheel_files`). Only the buckets that start within
`window_ms` from now are *loaded*: their entries not yet delivered or
cancelled sit in a heap ordered by due time; later buckets stay on disk and
cost no memory. As time moves, `advance` loads the next buckets; once a
bucket is past and nothing of it is outstanding, `close_ready` closes it (its
bucket file is deleted; its journal is kept for a while, to answer cancels).
`closed_below` (persisted in the progress file) is the first bucket not closed.

A message always goes to bucket max(its eligible bucket, closed_below), where
eligible = max(DELIVER_AT_MS, the time the scheduler stored it): a message that
arrives late is due at once, in a bucket that is still open.

Nothing here touches the network or asyncio: the app drives it with the clock.
"""
from __future__ import annotations

import heapq
import logging
import os
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

from ferry_delay_scheduler import wheel_files as wf
from ferry_delay_scheduler.wheel_files import FINAL_STATES, EntryState

log = logging.getLogger(__name__)

# A past bucket stays open this long after its end: a message stored just before
# the end may still be on its way into the wheel (it waits for the local fsync).
CLOSE_GRACE_MS = 60_000


def now_ms() -> int:
    return int(time.time() * 1000)


class Due(NamedTuple):
    """One message handed out for delivery: its due time, local phy offset and bucket."""

    due_ms: int
    phy_offset: int
    bucket: int


class CancelOutcome(NamedTuple):
    """What `cancel` found: state is CANCELLED (now or before), DELIVERED, or SENDING."""

    state: EntryState
    time_ms: int
    changed: bool = False  # this call cancelled it (a repeated cancel finds it cancelled)


class TimingWheel:
    """Bucket files on disk plus a heap of the near window in memory."""

    def __init__(self, root: Path, *, bucket_ms: int = 60_000, window_ms: int = 60_000,
                 journal_retention_ms: int = 72 * 3_600_000) -> None:
        self.dir = root
        self.bucket_ms = bucket_ms
        self.window_ms = window_ms
        self.journal_retention_ms = journal_retention_ms
        self.closed_below = 0
        self.loaded_through = 0  # buckets below this are loaded (or closed)
        self.pending = 0  # messages neither delivered nor cancelled (approximate after a crash)
        self.torn_entries = 0  # entries dropped on load because their CRC failed
        self.version = 0  # moves whenever entries join the heap (lets a prefetcher skip rescans)
        self._heap: list[tuple[int, int, int]] = []  # (ready_ms, phy, bucket)
        self._outstanding: dict[int, int] = {}  # loaded bucket -> entries not final
        self._inflight: dict[int, int] = {}  # phy -> bucket, handed out and not settled
        self._cancelled: set[int] = set()  # phys in the heap whose cancel is journaled
        self._suspects: set[int] = set()  # SENDING journaled before a crash: maybe duplicates
        self._retry_due: dict[int, int] = {}  # phy -> its due time, while it waits for a retry
        self._on_disk: set[int] = set()  # unloaded buckets with a bucket file
        self._buffered: dict[int, list[bytes]] = defaultdict(list)  # appends not yet written
        # Appends handed to a writer thread (`write_staged`); the lock also covers each
        # file write, so that `_load` never reads a bucket file half written.
        self._staged: dict[int, list[bytes]] = {}
        self._write_lock = threading.Lock()
        self._unsynced: set[str] = set()

    # -- opening ---------------------------------------------------------------------

    def open(self, closed_below: int) -> None:
        """Take the state of the directory: which buckets wait on disk, how much is pending."""
        self.dir.mkdir(parents=True, exist_ok=True)
        self.closed_below = self.loaded_through = closed_below
        pending = 0
        for name in os.listdir(self.dir):
            bucket = wf.parse_name(name, wf.BUCKET_SUFFIX)
            if bucket is None:
                continue
            if bucket < closed_below:  # closed before a crash removed it
                os.unlink(self.dir / name)
                continue
            self._on_disk.add(bucket)
            size = os.path.getsize(self.dir / name)
            entries = max(0, size - wf.FILE_HEADER.size) // wf.ENTRY_SIZE
            final = sum(1 for _, _, s in wf.read_entries(str(self._path(bucket, wf.JOURNAL_SUFFIX)),
                                                         wf.KIND_JOURNAL).entries
                        if s in FINAL_STATES)
            pending += max(0, entries - final)
        self.pending = pending

    # -- adding ----------------------------------------------------------------------

    def bucket_of(self, due_ms: int, stored_ms: int) -> int:
        """The bucket a message due at `due_ms`, stored locally at `stored_ms`, goes to."""
        return max(max(due_ms, stored_ms) // self.bucket_ms, self.closed_below)

    def add(self, entries: list[tuple[int, int, int]]) -> None:
        """Add messages as (due_ms, stored_ms, phy_offset); they are on disk once flushed."""
        for due, stored, phy in entries:
            bucket = self.bucket_of(due, stored)
            self._buffered[bucket].append(wf.encode_entry(due, phy, 0))
            if bucket < self.loaded_through:
                self.version += 1
                heapq.heappush(self._heap, (due, phy, bucket))
                self._outstanding[bucket] = self._outstanding.get(bucket, 0) + 1
            else:
                self._on_disk.add(bucket)
        self.pending += len(entries)

    def flush(self) -> None:
        """Write buffered bucket entries now (one append per bucket); no fsync (see `sync`)."""
        self.stage_writes()
        self._unsynced.update(self.write_staged())

    def stage_writes(self) -> None:
        """Hand the buffered entries to `write_staged` (which may run in another thread)."""
        buffered, self._buffered = self._buffered, defaultdict(list)
        with self._write_lock:
            for bucket, parts in buffered.items():
                self._staged.setdefault(bucket, []).extend(parts)

    def write_staged(self) -> list[str]:
        """Append every staged entry to its bucket file; the paths written (thread-safe).

        Entries of a month of buckets touch thousands of files per second: the
        app runs this off the event loop so that deliveries never wait on it.
        """
        paths: list[str] = []
        while True:
            with self._write_lock:
                if not self._staged:
                    return paths
                bucket, parts = self._staged.popitem()
                path = str(self._path(bucket, wf.BUCKET_SUFFIX))
                wf.append(path, wf.KIND_BUCKET, bucket * self.bucket_ms, b"".join(parts))
            paths.append(path)

    def take_unsynced(self) -> list[str]:
        """Files written since the last call: what `wheel_files.sync_paths` must make durable."""
        paths, self._unsynced = self._unsynced, set()
        return sorted(paths)

    def sync(self) -> None:
        """Write buffered entries and make every written file durable (fdatasync)."""
        self.flush()
        wf.sync_paths(self.take_unsynced(), str(self.dir))

    # -- the window ------------------------------------------------------------------

    def advance(self, now: int) -> int:
        """Load every bucket that starts before now + window_ms; how many entries were loaded."""
        target = (now + self.window_ms) // self.bucket_ms
        loaded = 0
        while self.loaded_through <= target:
            bucket = self.loaded_through
            first = min(self._on_disk, default=None)
            if first is None or first > target:
                self.loaded_through = target + 1  # nothing on disk that soon: skip ahead
                break
            if first > bucket:
                self.loaded_through = first
                continue
            loaded += self._load(bucket)
            self.loaded_through = bucket + 1
        return loaded

    def _load(self, bucket: int) -> int:
        self._outstanding.setdefault(bucket, 0)
        if bucket not in self._on_disk:
            return 0
        self._on_disk.discard(bucket)
        with self._write_lock:  # what waits to be written goes first
            parts = self._staged.pop(bucket, []) + self._buffered.pop(bucket, [])
            if parts:
                # Synced at once: a progress file saved meanwhile may count these entries
                # as on disk, and the writer thread that would have synced them never sees them.
                self._append(bucket, wf.BUCKET_SUFFIX, wf.KIND_BUCKET, b"".join(parts),
                             sync=True)
        read = wf.read_entries(str(self._path(bucket, wf.BUCKET_SUFFIX)), wf.KIND_BUCKET)
        journal = wf.read_entries(str(self._path(bucket, wf.JOURNAL_SUFFIX)), wf.KIND_JOURNAL)
        self.torn_entries += read.bad_entries + journal.bad_entries
        final = {phy for phy, _, state in journal.entries if state in FINAL_STATES}
        sending = {phy for phy, _, state in journal.entries if state == EntryState.SENDING}
        seen: set[int] = set()
        count = 0
        for due, phy, _ in read.entries:
            if phy in final or phy in seen:  # duplicates come from recovery re-deriving entries
                continue
            seen.add(phy)
            heapq.heappush(self._heap, (due, phy, bucket))
            if phy in sending:
                self._suspects.add(phy)
            count += 1
        self._outstanding[bucket] += count
        self.version += 1
        if read.bad_entries:
            log.warning("bucket %d: %d entries failed their CRC and were skipped", bucket,
                        read.bad_entries)
        return count

    def next_ready_ms(self) -> int | None:
        """When the earliest loaded message is due (None: nothing loaded)."""
        return self._heap[0][0] if self._heap else None

    def upcoming(self, until_ms: int) -> Iterator[tuple[int, int]]:
        """(due_ms, phy) of loaded messages due by `until_ms`, in no order (for prefetching).

        Walks the heap's list: call it and finish with it within one turn of the loop.
        """
        cancelled = self._cancelled
        for due, phy, _ in self._heap:
            if due <= until_ms and phy not in cancelled:
                yield due, phy

    def pop_due(self, now: int, limit: int) -> list[Due]:
        """Up to `limit` loaded messages due at or before `now`, earliest first."""
        out: list[Due] = []
        heap, cancelled = self._heap, self._cancelled
        while heap and heap[0][0] <= now and len(out) < limit:
            due, phy, bucket = heapq.heappop(heap)
            if phy in cancelled:
                cancelled.discard(phy)
                self._retry_due.pop(phy, None)
                self._settle(bucket)
                continue
            if phy in self._inflight:  # a second copy of one entry (a recovery duplicate)
                self._settle(bucket)
                continue
            self._inflight[phy] = bucket
            out.append(Due(self._retry_due.pop(phy, due), phy, bucket))
        return out

    # -- outcomes --------------------------------------------------------------------

    def mark_sending(self, items: list[Due], at_ms: int) -> None:
        """Journal the intent to send (a crash after it may duplicate these; they are counted)."""
        self._journal(items, at_ms, EntryState.SENDING)

    def suspect(self, phys: list[int]) -> None:
        """These may have been delivered before (by a previous term): count them if sent."""
        self._suspects.update(phys)

    def mark_cancelled(self, items: list[Due], at_ms: int) -> None:
        """Handed out but found cancelled (the cancel book): settle them, never send them."""
        self._journal(items, at_ms, EntryState.CANCELLED)
        for item in items:
            self._suspects.discard(item.phy_offset)
            if self._inflight.pop(item.phy_offset, None) is not None:
                self._settle(item.bucket)
                self.pending -= 1

    def mark_delivered(self, items: list[Due], at_ms: int) -> int:
        """Journal the broker's acknowledgement; returns how many were suspected duplicates."""
        self._journal(items, at_ms, EntryState.DELIVERED)
        dups = 0
        for item in items:
            if self._inflight.pop(item.phy_offset, None) is not None:
                self._settle(item.bucket)
                self.pending -= 1
            if item.phy_offset in self._suspects:
                self._suspects.discard(item.phy_offset)
                dups += 1
        return dups

    def retry(self, items: list[Due], ready_ms: int) -> None:
        """Delivery failed: hand these out again at `ready_ms` (their due time is kept)."""
        for item in items:
            if self._inflight.pop(item.phy_offset, None) is not None:
                self._retry_due[item.phy_offset] = item.due_ms
                self.version += 1
                heapq.heappush(self._heap, (max(ready_ms, item.due_ms), item.phy_offset,
                                            item.bucket))

    def in_flight(self, phy: int) -> bool:
        return phy in self._inflight

    def state_of(self, due_ms: int, stored_ms: int, phy: int) -> CancelOutcome | None:
        """SENDING while in flight, the final state when settled, None while pending."""
        if phy in self._inflight:
            return CancelOutcome(EntryState.SENDING, 0)
        bucket = max(due_ms, stored_ms) // self.bucket_ms
        if bucket < self.closed_below:  # closed: every message of it was settled
            return self._settled_state(bucket, phy) or CancelOutcome(EntryState.DELIVERED, 0)
        return self._settled_state(max(bucket, self.closed_below), phy)

    def cancel(self, due_ms: int, stored_ms: int, phy: int, at_ms: int) -> CancelOutcome:
        """Cancel the message at `phy` unless it is settled; durable before it returns."""
        found = self.state_of(due_ms, stored_ms, phy)
        if found is not None:
            return CancelOutcome(EntryState.SENDING, at_ms) \
                if found.state == EntryState.SENDING else found
        bucket = max(max(due_ms, stored_ms) // self.bucket_ms, self.closed_below)
        self._append(bucket, wf.JOURNAL_SUFFIX, wf.KIND_JOURNAL,
                     wf.encode_entry(phy, at_ms, EntryState.CANCELLED), sync=True)
        if bucket < self.loaded_through:
            self._cancelled.add(phy)  # dropped from the heap when it comes up
        self.pending -= 1
        self.version += 1
        return CancelOutcome(EntryState.CANCELLED, at_ms, changed=True)

    def _settled_state(self, bucket: int, phy: int) -> CancelOutcome | None:
        if phy in self._cancelled:
            return CancelOutcome(EntryState.CANCELLED, 0)
        journal = wf.read_entries(str(self._path(bucket, wf.JOURNAL_SUFFIX)), wf.KIND_JOURNAL)
        for entry_phy, t, state in reversed(journal.entries):
            if entry_phy == phy and state in FINAL_STATES:
                return CancelOutcome(EntryState(state), t)
        return None

    def _settle(self, bucket: int) -> None:
        self._outstanding[bucket] = self._outstanding.get(bucket, 1) - 1

    # -- closing ---------------------------------------------------------------------

    def close_ready(self, now: int) -> bool:
        """Close past buckets with nothing outstanding; True when `closed_below` moved."""
        moved = False
        while (self.closed_below < self.loaded_through
               and self._outstanding.get(self.closed_below, 0) <= 0
               and now >= (self.closed_below + 1) * self.bucket_ms + CLOSE_GRACE_MS):
            bucket = self.closed_below
            self._outstanding.pop(bucket, None)
            with self._write_lock:
                unwritten = bool(self._buffered.get(bucket) or self._staged.get(bucket))
            if not unwritten:  # else the file stays; the next open removes it
                path = self._path(bucket, wf.BUCKET_SUFFIX)
                if path.exists():
                    path.unlink()
            self.closed_below += 1
            moved = True
        return moved

    def expire_journals(self, now: int) -> int:
        """Delete journals of buckets closed longer than the journal retention ago."""
        horizon = (now - self.journal_retention_ms) // self.bucket_ms
        removed = 0
        for name in os.listdir(self.dir):
            bucket = wf.parse_name(name, wf.JOURNAL_SUFFIX)
            if bucket is not None and bucket < min(horizon, self.closed_below):
                os.unlink(self.dir / name)
                removed += 1
        return removed

    # -- statistics ------------------------------------------------------------------

    def due_within(self, now: int, span_ms: int) -> int:
        """Loaded messages due before now + span_ms (in flight included)."""
        limit = now + span_ms
        return sum(1 for due, phy, _ in self._heap
                   if due <= limit and phy not in self._cancelled) + len(self._inflight)

    @property
    def loaded(self) -> int:
        return len(self._heap)

    @property
    def inflight(self) -> int:
        return len(self._inflight)

    # -- files -----------------------------------------------------------------------

    def _path(self, bucket: int, suffix: str) -> Path:
        return self.dir / wf.file_name(bucket, suffix)

    def _append(self, bucket: int, suffix: str, kind: int, data: bytes,
                sync: bool = False) -> None:
        path = str(self._path(bucket, suffix))
        wf.append(path, kind, bucket * self.bucket_ms, data, sync=sync)
        if not sync:
            self._unsynced.add(path)

    def _journal(self, items: list[Due], at_ms: int, state: EntryState) -> None:
        by_bucket: dict[int, list[bytes]] = defaultdict(list)
        for item in items:
            by_bucket[item.bucket].append(wf.encode_entry(item.phy_offset, at_ms, state))
        for bucket, parts in by_bucket.items():
            self._append(bucket, wf.JOURNAL_SUFFIX, wf.KIND_JOURNAL, b"".join(parts))
