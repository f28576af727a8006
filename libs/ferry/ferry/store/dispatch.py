"""Dispatch: turning appended records into consume-queue entries and index keys.

Every record becomes one CQ_ENTRY in the consume queue of its (topic, queue_id)
and index keys: `b"I" + msg_id` for its unique id and `b"K" + topic + b"\\x00" + key`
for each space-separated key. The put path dispatches each batch right after
writing it; recovery re-dispatches from the commit log with `redispatch`.
"""
from __future__ import annotations

import logging
import struct
from typing import NamedTuple

from crc32c import crc32c

from ferry.errors import CorruptRecordError

from .commit_log import CommitLog
from .consume_queue import CQ_ENTRY, ConsumeQueues
from .encode_context import ID_KEY_CRC
from .index_file import IndexService
from .record import BLANK_MAGIC, BLANK_SIZE, HEADER, HEADER_SIZE, check_record

log = logging.getLogger(__name__)

_SIZE_MAGIC = struct.Struct("<II")
_pack_entry = CQ_ENTRY.pack
_REDISPATCH_CHUNK = 4096


def index_keys(topic_b: bytes, keys_b: bytes, msg_id: bytes) -> list[bytes]:
    """The index keys of one record."""
    out = [b"I" + msg_id]
    if keys_b:
        prefix = b"K" + topic_b + b"\x00"
        out.extend(prefix + k for k in keys_b.split(b" ") if k)
    return out


class DispatchBatch:
    """Consume-queue entries and index items of a run of records, applied in one call each."""

    __slots__ = ("queues", "index_items")

    def __init__(self) -> None:
        # (topic, queue_id) -> [first queue offset, packed entries...]
        self.queues: dict[tuple[str, int], list] = {}
        self.index_items: list[tuple[int, int, int]] = []  # (key hash, phy, store ts)

    def add_entry(self, topic: str, queue_id: int, queue_offset: int, phy: int, size: int,
                  th: int) -> None:
        run = self.queues.get((topic, queue_id))
        if run is None:
            self.queues[(topic, queue_id)] = [queue_offset, _pack_entry(phy, size, th)]
        else:
            run.append(_pack_entry(phy, size, th))

    def add_keys(self, topic_b: bytes, keys_b: bytes, msg_id: bytes, phy: int,
                 store_ts_ms: int) -> None:
        items = self.index_items
        items.append((crc32c(msg_id, ID_KEY_CRC), phy, store_ts_ms))
        if keys_b:
            prefix = crc32c(b"K" + topic_b + b"\x00")
            for k in keys_b.split(b" "):
                if k:
                    items.append((crc32c(k, prefix), phy, store_ts_ms))

    def apply(self, cqs: ConsumeQueues, index: IndexService) -> None:
        for (topic, queue_id), run in self.queues.items():
            cqs.get_or_create(topic, queue_id).append(run[0], b"".join(run[1:]))
        if self.index_items:
            index.put_hashed(self.index_items)
        self.queues = {}
        self.index_items = []


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
    batch = DispatchBatch()
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
            problem = _check_at(view, rel, seg.size, pos)
            if problem is not None:
                break
        size, magic = _SIZE_MAGIC.unpack_from(view, rel)
        if magic == BLANK_MAGIC:
            pos = seg.end_offset
            continue
        h = HEADER.unpack_from(view, rel)
        queue_id, queue_offset, store_ts, th, msg_id = h[4], h[5], h[8], h[11], h[12]
        p = rel + HEADER_SIZE
        topic_b = bytes(view[p:p + h[13]])
        if pos >= cq_from:
            batch.add_entry(topic_b.decode(), queue_id, queue_offset, pos, size, th)
        if pos >= index_from:
            k = p + h[13] + h[14] + h[15] + h[17]
            batch.add_keys(topic_b, bytes(view[k:k + h[18]]), msg_id, pos, store_ts)
        pos += size
        count += 1
        pending += 1
        if pending >= _REDISPATCH_CHUNK:
            batch.apply(cqs, index)
            pending = 0
    batch.apply(cqs, index)
    return RedispatchResult(count, min(pos, end), problem)


def _check_at(view: memoryview, rel: int, seg_size: int, pos: int) -> str | None:
    """Why the record (or end-of-segment marker) at `rel` is not valid, or None if it is."""
    if rel + BLANK_SIZE > seg_size:
        return f"no room for a record at {pos}"
    size, magic = _SIZE_MAGIC.unpack_from(view, rel)
    if magic == BLANK_MAGIC:
        return None if rel + size == seg_size else f"bad end-of-segment marker at {pos}"
    try:
        check_record(view, rel, seg_size - BLANK_SIZE)
    except CorruptRecordError as exc:
        return str(exc)
    if HEADER.unpack_from(view, rel)[6] != pos:
        return f"the record at {pos} claims another phy offset"
    return None
