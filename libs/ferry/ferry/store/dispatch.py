"""Dispatch: turning appended records into consume-queue entries and index keys.

Every record becomes one CQ_ENTRY in the consume queue of its (topic, queue_id)
and the index keys of `index_keys.py`. `LiveDispatch` queues what each written
batch yields and applies it in one consume-queue write per queue and one index
call; recovery re-dispatches from the commit log with `redispatch`.
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import NamedTuple

from ferry.codec.record import (
    AT_PHY_OFFSET,
    BLANK_MAGIC,
    BLANK_SIZE,
    H_QUEUE_ID,
    H_QUEUE_OFFSET,
    H_TAG_HASH,
    H_TOPIC_LEN,
    H_TOTAL_SIZE,
    HEADER,
    HEADER_SIZE,
    I64,
    SIZE_MAGIC,
    check_record,
)
from ferry.errors import CorruptRecordError

from .commit_log import CommitLog
from .consume_queue import CQ_ENTRY
from .consume_queues import ConsumeQueues
from .encode_context import QueueEntries
from .index_file import IndexService
from .index_keys import IdRuns, IndexItem, key_prefix_crc

log = logging.getLogger(__name__)

# Queued index items beyond which an append applies the dispatch itself.
DISPATCH_BACKLOG = 512
_pack_entry = CQ_ENTRY.pack
_REDISPATCH_CHUNK = 4096


class PendingDispatch:
    """Consume-queue entries and index items not yet applied, applied in one call each.

    Work is dropped only once applied: when a step raises (an I/O error, no file
    descriptor left), the rest stays for the next `apply` (re-applying is idempotent).
    """

    __slots__ = ("queues", "index_items", "id_runs")

    def __init__(self) -> None:
        self.queues: dict[tuple[str, int], QueueEntries] = {}
        self.index_items: list[IndexItem] = []
        self.id_runs = IdRuns()  # the id run `add_record` continues

    def add_entry(self, topic: str, queue_id: int, queue_offset: int, phy: int, size: int,
                  th: int) -> None:
        run = self.queues.get((topic, queue_id))
        if run is None:
            self.queues[(topic, queue_id)] = QueueEntries(queue_offset,
                                                          [_pack_entry(phy, size, th)])
        else:
            run.entries.append(_pack_entry(phy, size, th))

    def apply(self, cqs: ConsumeQueues, index: IndexService) -> None:
        queues = self.queues
        for key, run in list(queues.items()):
            cqs.get_or_create(key[0], key[1]).append(run.first_offset, b"".join(run.entries))
            del queues[key]
        if self.index_items:
            index.put_hashed(self.index_items)
            self.index_items = []


class LiveDispatch:
    """The dispatch of the batches the appender writes: queued, applied in commit-log order.

    Deferred so that many small appends (sync mode: one message per producer
    request) share one consume-queue write per queue and one index call; every
    read of the store calls `dispatch` first, so readers never see a lag.
    """

    def __init__(self, cl: CommitLog, cqs: ConsumeQueues, index: IndexService,
                 on_error: Callable[[BaseException], None] | None = None) -> None:
        self._cl = cl
        self._cqs = cqs
        self._index = index
        self._on_error = on_error
        self._pending = PendingDispatch()
        # Commit-log offset at or below the first record whose dispatch is pending.
        self._pending_from = cl.write_offset
        # Records queued since the last apply: with id runs a batch of 256 queues one or
        # two keys, so the backlog is also counted in records (the apply stays small).
        self._queued_records = 0

    def add(self, start_offset: int, runs: Mapping[tuple[str, int], QueueEntries],
            items: list[IndexItem]) -> None:
        """Queue a written batch that starts at `start_offset`; apply once the queue is long.

        A failure to apply here is reported to `on_error` (the batch is written:
        the append does not fail) and stays queued.
        """
        pending = self._pending
        if not pending.index_items:  # (every batch queues an id-run key: empty = nothing pending)
            self._pending_from = start_offset
            pending.index_items = items
        else:
            pending.index_items.extend(items)
        # (PendingDispatch.add_runs, inlined: this runs once per append)
        queues = pending.queues
        records = self._queued_records
        for key, q in runs.items():
            records += len(q.entries)
            queued = queues.get(key)
            if queued is None:
                queues[key] = q  # the batch is written: its run is no longer staged into
            else:
                queued.entries.extend(q.entries)  # consecutive queue offsets: one run
        self._queued_records = records
        if len(pending.index_items) >= DISPATCH_BACKLOG or records >= DISPATCH_BACKLOG:
            try:
                self.dispatch()
            except Exception as exc:
                if self._on_error is None:
                    raise
                self._on_error(exc)

    @property
    def dispatched_offset(self) -> int:
        """Every record below this commit-log offset has its queue entry and index keys applied."""
        return self._pending_from if self._pending.index_items else self._cl.write_offset

    def dispatch(self) -> None:
        """Apply the queued consume-queue entries and index keys (in commit-log order).

        When a step raises, the rest stays queued for the next call and
        `dispatched_offset` stays where it was.
        """
        if self._pending.index_items:
            self._pending.apply(self._cqs, self._index)
        self._queued_records = 0


class RedispatchResult(NamedTuple):
    """How far a re-dispatch got: `end` is where it stopped (the requested end unless a
    record below `verified_from` failed its check, described by `problem`)."""

    records: int
    end: int
    problem: str | None


def redispatch(commit_log: CommitLog, cqs: ConsumeQueues, index: IndexService, start: int,
               end: int, cq_from: int, index_from: int, verified_from: int) -> RedispatchResult:
    """Re-dispatch the records in [start, end).

    Consume-queue entries are rebuilt for records at or after `cq_from`, index keys
    for records at or after `index_from`; `start` is the smaller of the two. Records
    from `verified_from` on were verified by recovery's scan; those below it are
    checked here (the cost falls only on the crash path), and the first that fails
    stops the re-dispatch there (bit rot below the checkpoint: the caller cuts the
    log at it, like a torn tail).
    """
    batch = PendingDispatch()
    pos = start
    count = pending = 0
    problem: str | None = None
    while pos < end:
        seg = commit_log.segment_for(pos)
        if seg is None:
            break
        rel = pos - seg.start_offset
        view = seg.view
        if pos < verified_from:
            problem = check_unit(view, rel, seg.size - rel, pos)
            if problem is not None:
                break
        size, magic = SIZE_MAGIC.unpack_from(view, rel)
        if magic == BLANK_MAGIC:
            pos = seg.end_offset
            continue
        add_record(batch, view, rel, pos, cq=pos >= cq_from, keys=pos >= index_from)
        pos += size
        count += 1
        pending += 1
        if pending >= _REDISPATCH_CHUNK:
            batch.apply(cqs, index)
            pending = 0
    batch.apply(cqs, index)
    return RedispatchResult(count, min(pos, end), problem)


def add_record(batch: PendingDispatch, buf: bytes | memoryview, off: int, pos: int, *,
               cq: bool = True, keys: bool = True) -> None:
    """Queue into `batch` the consume-queue entry (if `cq`) and index keys (if `keys`) of
    the checked record at `buf[off:]`, stored at commit-log offset `pos`."""
    h = HEADER.unpack_from(buf, off)
    p = off + HEADER_SIZE
    topic_b = bytes(buf[p:p + h[H_TOPIC_LEN]])
    if cq:
        batch.add_entry(topic_b.decode(), h[H_QUEUE_ID], h[H_QUEUE_OFFSET], pos, h[H_TOTAL_SIZE],
                        h[H_TAG_HASH])
    if keys:
        batch.id_runs.add(batch.index_items, h, buf, off, key_prefix_crc(topic_b), pos)


def check_unit(buf: bytes | memoryview, off: int, seg_room: int, pos: int) -> str | None:
    """Why the unit at `buf[off:]` (a record or an end-of-segment marker) is not valid
    where it lands, or None if it is.

    It lands at commit-log offset `pos`, `seg_room` bytes before its segment ends: a
    record must leave BLANK_SIZE bytes free after it and name `pos` as its own offset;
    a marker must fill the segment exactly. The whole unit must be in `buf`.
    """
    if seg_room < BLANK_SIZE:
        return f"no room for a record at {pos}"
    if len(buf) - off < BLANK_SIZE:
        return f"truncated record at {pos}"
    size, magic = SIZE_MAGIC.unpack_from(buf, off)
    if magic == BLANK_MAGIC:
        if size != seg_room:
            return f"bad end-of-segment marker at {pos}"
        return None if off + size <= len(buf) else f"truncated end-of-segment marker at {pos}"
    try:
        check_record(buf, off, min(len(buf), off + seg_room - BLANK_SIZE))
    except CorruptRecordError as exc:
        return f"{exc} (commit-log offset {pos})"
    if I64.unpack_from(buf, off + AT_PHY_OFFSET)[0] != pos:
        return f"the record at {pos} claims another phy offset"
    return None
