"""Reading a consume queue's records out of the commit log, checked, for get_messages.

Every served record is checked against its consume-queue entry (size, magic,
CRC) and skipped with an error log if it fails (see store-format.md, "Reads
verify as well", for why a read keeps its CRC check). Records are returned as
zero-copy read-only views of the commit log's mapping.

A reader may filter twice: `tag_hashes` on the consume-queue entry (before the
commit log is touched), then `match`, a predicate over the checked record (the
broker's exact tag and SQL92 check, `ferry.filter.record_matcher`; the store
only calls it). A record either rejects is skipped for good: the returned next
offset is past it.
"""
from __future__ import annotations

import logging
from collections.abc import Callable

from crc32c import crc32c

from ferry.codec.record import (
    AT_PHY_OFFSET,
    CRC_START,
    HEADER_SIZE,
    I64,
    RECORD_MAGIC,
    SIZE_MAGIC_CRC,
    StoredMessage,
    check_record,
    decode_record,
)
from ferry.errors import CorruptRecordError

from .commit_log import CommitLog
from .consume_queue import ConsumeQueue

log = logging.getLogger(__name__)

# A filtered pull scans at most this many consume-queue entries ("a limit on everything").
MAX_SCAN_ENTRIES = 16_000
_SCAN_CHUNK = 1024
_unpack_check = SIZE_MAGIC_CRC.unpack_from

#: A predicate over one checked stored record (its bytes, as a view): keep it?
RecordMatch = Callable[[memoryview], bool]


def read_entries(cl: CommitLog, cq: ConsumeQueue, queue_offset: int, hi: int, max_count: int,
                 max_bytes: int, tag_hashes: set[int] | frozenset[int] | None,
                 match: RecordMatch | None = None) -> tuple[list[memoryview], int]:
    """The records of cq from queue_offset on, within the limits; and the next offset."""
    records: list[memoryview] = []
    nxt = queue_offset
    scan_limit = min(hi, queue_offset + MAX_SCAN_ENTRIES)
    filtered = tag_hashes is not None or match is not None
    while nxt < scan_limit and len(records) < max_count:
        want = _SCAN_CHUNK if filtered else max_count - len(records)
        entries = cq.get(nxt, min(want, scan_limit - nxt))
        if not entries:
            break
        nxt, full = _read_run(cl, cq, entries, nxt, records, max_count, max_bytes, tag_hashes,
                              match)
        if full:
            break
    return records, nxt


def _read_run(cl: CommitLog, cq: ConsumeQueue, entries: list[tuple[int, int, int]], nxt: int,
              records: list[memoryview], max_count: int, max_bytes: int,
              tag_hashes: set[int] | frozenset[int] | None, match: RecordMatch | None
              ) -> tuple[int, bool]:
    """Serve `entries` (queue offsets from `nxt` on) into `records`; (next offset, limit hit)."""
    add = records.append
    total = sum(len(r) for r in records)
    segs = cl.segments
    base, seg_bytes, write_end = segs[0].start_offset, cl.segment_bytes, cl.write_offset
    seg_lo, seg_hi, view = 0, -1, memoryview(b"")  # the segment at hand: [seg_lo, seg_hi)
    for phy, size, th in entries:
        if tag_hashes is not None and th not in tag_hashes:
            nxt += 1
            continue
        if total + size > max_bytes and records:
            return nxt, True
        nxt += 1
        end = phy + size
        if phy < seg_lo or end > seg_hi:  # another segment (consecutive records share one)
            i = (phy - base) // seg_bytes
            if i < 0 or end > write_end:
                continue  # deleted by retention (or past the end): skip the entry
            seg = segs[i]
            seg_lo, seg_hi, view = seg.start_offset, min(seg.end_offset, write_end), seg.read_view
        raw = view[phy - seg_lo:end - seg_lo]
        got_size, magic, crc = _unpack_check(raw)
        if got_size != size or magic != RECORD_MAGIC or crc32c(raw[CRC_START:]) != crc:
            log.error("skipping corrupt record at phy %d (%s/%d offset %d)", phy,
                      cq.topic, cq.queue_id, nxt - 1)
            continue  # never served
        if match is not None and not match(raw):
            continue  # filtered out: skipped for good (nxt is already past it)
        add(raw)
        total += size
        if len(records) >= max_count:
            return nxt, True
    return nxt, False


def _raw_at(cl: CommitLog, phy_offset: int) -> memoryview | None:
    """The bytes its header claims for a record at `phy_offset` (unchecked), if stored."""
    if phy_offset < 0:
        return None
    head = cl.read(phy_offset, HEADER_SIZE)
    return None if head is None else cl.read(phy_offset, _unpack_check(head)[0])


def read_checked(cl: CommitLog, phy_offset: int) -> memoryview | None:
    """The record at `phy_offset` if one starts there and passes check_record (and
    names that offset as its own); None otherwise."""
    raw = _raw_at(cl, phy_offset)
    if raw is None:
        return None
    try:
        check_record(raw)
    except CorruptRecordError:
        return None
    return raw if I64.unpack_from(raw, AT_PHY_OFFSET)[0] == phy_offset else None


def read_message(cl: CommitLog, phy_offset: int) -> StoredMessage | None:
    """The decoded (so verified) record at `phy_offset`, or None when no valid record
    starts there."""
    raw = _raw_at(cl, phy_offset)
    if raw is None:
        return None
    try:
        msg = decode_record(raw)
    except CorruptRecordError:
        return None
    return msg if msg.phy_offset == phy_offset else None
