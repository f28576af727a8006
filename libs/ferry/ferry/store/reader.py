"""Reading a consume queue's records out of the commit log, checked, for get_messages.

Every served record is checked against its consume-queue entry (its size; then
magic and CRC by `ferry.codec.record.check_records`) and skipped with an error log
if it fails (see store-format.md, "Reads verify as well", for why a read keeps its
CRC check). Records are returned as zero-copy read-only views of the commit
log's mapping.

A reader may filter twice: `tag_hashes` on the consume-queue entry (before the
commit log is touched), then `match`, a predicate over the checked record (the
broker's exact tag and SQL92 check, `ferry.filter.record_matcher`; the store
only calls it). A record either rejects is skipped for good: the returned next
offset is past it. A predicate may be slow (a selector of thousands of
characters takes hundreds of microseconds a record), so a caller can bound a
scan's time too (`max_scan_ms`): it is checked between runs of entries (sized
by the cost seen so far), and the scan stops there with what it found and the
offset reached.

Cold reads (a consumer far behind, its records no longer in the page cache):
read through the mapping, every page fault blocks the caller on the disk, and
the caller is a broker's event loop, which then serves nobody meanwhile. So
`cold_spans` says, without blocking, which parts of the commit log a read would
touch that are not in the page cache, and `load_spans` reads them in (blocking:
on another thread, without the store lock); the read that follows then only
copies from memory. Both are hints: pages evicted in between are faulted in as
before, and a span is bounded like the read itself (`max_count`, `max_bytes`).
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable
from operator import itemgetter

from ferry.codec.record import (
    AT_PHY_OFFSET,
    H_TOTAL_SIZE,
    HEADER_SIZE,
    I64,
    SIZE_MAGIC_CRC,
    StoredMessage,
    check_record,
    check_records,
    decode_record,
)
from ferry.errors import CorruptRecordError

from .commit_log import CommitLog
from .consume_queue import ConsumeQueue
from .mapped_file import load_span
from .results import GetResult, GetStatus

log = logging.getLogger(__name__)

# A filtered pull scans at most this many consume-queue entries ("a limit on everything").
MAX_SCAN_ENTRIES = 16_000
_SCAN_CHUNK = 1024
# Entries of the first run of a scan whose time is bounded: small enough that a
# slow predicate stays within some tens of milliseconds; later runs are sized
# by the cost seen (`_next_chunk`).
_FIRST_TIMED_CHUNK = 64
_unpack_check = SIZE_MAGIC_CRC.unpack_from
_size_of = itemgetter(H_TOTAL_SIZE)

#: A predicate over one checked stored record (its bytes, as a view): keep it?
RecordMatch = Callable[[memoryview], bool]
#: A part of a commit-log segment file: (path, offset in the file, length in bytes).
FileSpan = tuple[str, int, int]


def read_queue(cl: CommitLog, cq: ConsumeQueue | None, queue_offset: int, max_count: int,
               max_bytes: int, tag_hashes: set[int] | frozenset[int] | None,
               match: RecordMatch | None, max_scan_ms: float | None,
               stop_offset: int | None, check: bool = True) -> GetResult:
    """MessageStore.get_messages's answer for queue `cq` (None: not stored yet)."""
    if cq is None or cq.max_offset == 0:
        return GetResult(GetStatus.NO_MESSAGE_IN_QUEUE, [], 0, 0, 0)
    lo, hi = cq.min_offset, cq.max_offset
    if queue_offset < lo:
        return GetResult(GetStatus.OFFSET_TOO_SMALL, [], lo, lo, hi)
    if queue_offset == hi:
        return GetResult(GetStatus.OFFSET_OVERFLOW_ONE, [], hi, lo, hi)
    if queue_offset > hi:
        return GetResult(GetStatus.OFFSET_OVERFLOW_BADLY, [], hi, lo, hi)
    stop = hi if stop_offset is None or stop_offset <= queue_offset else min(hi, stop_offset)
    records, nxt = read_entries(cl, cq, queue_offset, stop, max_count, max_bytes,
                                tag_hashes, match, max_scan_ms, check)
    status = GetStatus.FOUND if records else GetStatus.NO_MATCHED_MESSAGE
    return GetResult(status, records, nxt, lo, hi)


def read_entries(cl: CommitLog, cq: ConsumeQueue, queue_offset: int, hi: int, max_count: int,
                 max_bytes: int, tag_hashes: set[int] | frozenset[int] | None,
                 match: RecordMatch | None = None, max_scan_ms: float | None = None,
                 check: bool = True) -> tuple[list[memoryview], int]:
    """The records of cq from queue_offset on, within the limits; and the next offset.

    With `max_scan_ms` (used only with `match`) the scan stops once that long
    passed, at a run boundary (at least one run is always read). `check` False
    (only without `match`, which needs checked records): the records are served
    as stored, unchecked, for a reader that checks every record itself.
    """
    records: list[memoryview] = []
    nxt = queue_offset
    scan_limit = min(hi, queue_offset + MAX_SCAN_ENTRIES)
    filtered = tag_hashes is not None or match is not None
    deadline = (None if match is None or max_scan_ms is None
                else time.monotonic() + max_scan_ms / 1000.0)
    chunk = _SCAN_CHUNK if deadline is None else _FIRST_TIMED_CHUNK
    while nxt < scan_limit and len(records) < max_count:
        want = chunk if filtered else max_count - len(records)
        entries = cq.get(nxt, min(want, scan_limit - nxt))
        if not entries:
            break
        started = time.monotonic() if deadline is not None else 0.0
        nxt, full = _read_run(cl, cq, entries, nxt, records, max_count, max_bytes, tag_hashes,
                              match, check)
        if full:
            break
        if deadline is not None:
            now = time.monotonic()
            if now >= deadline:
                break
            chunk = _next_chunk(now - started, len(entries), deadline - now)
    return records, nxt


def _next_chunk(took_s: float, entries: int, left_s: float) -> int:
    """Entries for the next run of a timed scan: what the time left allows at the
    cost per entry just seen (a cheap predicate soon reads full runs)."""
    if took_s <= 0:
        return _SCAN_CHUNK
    return max(_FIRST_TIMED_CHUNK, min(_SCAN_CHUNK, int(left_s * entries / took_s)))


def _read_run(cl: CommitLog, cq: ConsumeQueue, entries: list[tuple[int, int, int]], nxt: int,
              records: list[memoryview], max_count: int, max_bytes: int,
              tag_hashes: set[int] | frozenset[int] | None, match: RecordMatch | None,
              check: bool = True) -> tuple[int, bool]:
    """Serve `entries` (queue offsets from `nxt` on) into `records`; (next offset, limit hit).

    Without `match`, records are checked a span at a time: consecutive entries whose
    records lie back to back in one segment (a batch's, usually) are one
    `check_records` call (`_check_span`); a predicate sees only checked records."""
    add = records.append
    total = sum(len(r) for r in records)
    segs = cl.segments
    base, seg_bytes, write_end = segs[0].start_offset, cl.segment_bytes, cl.write_offset
    seg_lo, seg_hi, view = 0, -1, memoryview(b"")  # the segment at hand: [seg_lo, seg_hi)
    # The unchecked span: its first record's index in `records` (-1: none), its bytes in
    # the view, its first record's queue offset, and its entries' sizes.
    span_at, span_lo, span_end, span_qoff = -1, 0, -1, 0
    sizes: list[int] = []
    full = False
    for phy, size, th in entries:
        if tag_hashes is not None and th not in tag_hashes:
            nxt += 1
            continue
        if total + size > max_bytes and records:
            full = True
            break
        nxt += 1
        end = phy + size
        if phy < seg_lo or end > seg_hi:  # another segment (consecutive records share one)
            if span_at >= 0:
                _check_span(view, span_lo, span_end, sizes, records, span_at, seg_lo, cq,
                            span_qoff)
                span_at, span_end = -1, -1
            i = (phy - base) // seg_bytes
            if i < 0 or end > write_end:
                continue  # deleted by retention (or past the end): skip the entry
            seg = segs[i]
            seg_lo, seg_hi, view = seg.start_offset, min(seg.end_offset, write_end), seg.read_view
        rel = phy - seg_lo
        raw = view[rel:end - seg_lo]
        if match is None:
            if check:   # else no span is opened, and nothing is checked
                if rel != span_end:
                    if span_at >= 0:
                        _check_span(view, span_lo, span_end, sizes, records, span_at, seg_lo,
                                    cq, span_qoff)
                    span_at, span_lo, span_qoff, sizes = len(records), rel, nxt - 1, []
                span_end = rel + size
                sizes.append(size)
        elif not _checked(view, rel, size, seg_lo, cq, nxt - 1) or not match(raw):
            continue  # corrupt (never served), or filtered out: skipped for good
        add(raw)
        total += size
        if len(records) >= max_count:
            full = True
            break
    if span_at >= 0:
        _check_span(view, span_lo, span_end, sizes, records, span_at, seg_lo, cq, span_qoff)
    return nxt, full


def _check_span(view: memoryview, lo: int, end: int, sizes: list[int],
                records: list[memoryview], at: int, seg_lo: int, cq: ConsumeQueue,
                queue_offset: int) -> None:
    """Check the records from `records[at]` on, back to back in `view[lo:end]` with their
    consume-queue entries' `sizes`, in one check_records call; when one fails, check
    each and drop those that fail."""
    try:
        if list(map(_size_of, check_records(view, lo, end, SIZE_MAGIC_CRC))) == sizes:
            return  # each its consume-queue entry's size
    except CorruptRecordError:
        pass
    kept = []
    for raw in records[at:]:
        if _checked(view, lo, len(raw), seg_lo, cq, queue_offset):
            kept.append(raw)
        lo, queue_offset = lo + len(raw), queue_offset + 1
    records[at:] = kept


def _checked(view: memoryview, rel: int, size: int, seg_lo: int, cq: ConsumeQueue,
             queue_offset: int) -> bool:
    """Whether the record of a `size`-byte consume-queue entry at `rel` of a segment's view
    passes check_records (and is that size); logs the error when it does not."""
    try:
        if check_records(view, rel, rel + size, SIZE_MAGIC_CRC)[0][H_TOTAL_SIZE] == size:
            return True
        raise CorruptRecordError(f"its size is not the consume queue's {size}")
    except CorruptRecordError as exc:
        log.error("skipping corrupt record at phy %d (%s/%d offset %d): %s", seg_lo + rel,
                  cq.topic, cq.queue_id, queue_offset, exc)
        return False


def cold_spans(cl: CommitLog, cq: ConsumeQueue, queue_offset: int, hi: int, max_count: int,
               max_bytes: int) -> list[FileSpan]:
    """The parts of the commit log that read_entries from `queue_offset` (unfiltered, within
    `max_count` and `max_bytes`) would read and that are not in the page cache; never blocks
    on the commit log (the consume-queue entries are read through their mapping).

    A read that starts in the active segment (the one being written, always in the page
    cache in practice: a consumer near the head) answers [] from its first entry alone:
    the probes cost a filtered pull, which reads many entries per record it delivers,
    a quarter of its rate (filter.tag)."""
    first = cq.get(queue_offset, 1)
    if not first or first[0][0] >= cl.segments[-1].start_offset:
        return []
    count = min(max_count, hi - queue_offset)
    if count <= 0:
        return []
    lo = first[0][0]
    # A queue's records lie in log order: when the last entry within `max_count` ends within
    # `max_bytes` of the first, the read takes them all and ends there (two entries read,
    # not a loop over up to MAX_PULL_COUNT: this probe ran on every pull of a lagging reader).
    last = cq.get(queue_offset + count - 1, 1) if count > 1 else first
    if not last:
        return []
    last_phy, last_size = last[0][0], last[0][1]
    end = last_phy + last_size
    if last_phy < lo or end - lo > max_bytes:   # out of order, or max_bytes may stop it
        entries = cq.get(queue_offset, count)
        total, end = 0, lo
        for phy, size, _ in entries:
            if total + size > max_bytes and total:
                break
            total += size
            end = max(end, phy + size)
    end = min(end, cl.write_offset)
    segs = cl.segments
    base, seg_bytes = segs[0].start_offset, cl.segment_bytes
    spans: list[FileSpan] = []
    at = max(lo, base)
    while at < end:
        seg = segs[(at - base) // seg_bytes]
        stop = min(end, seg.end_offset)
        rel = at - seg.start_offset
        if not seg.resident(rel, stop - at):
            spans.append((seg.path, rel, stop - at))
        at = stop
    return spans


def load_spans(spans: list[FileSpan]) -> None:
    """Read `spans` into the page cache (blocking on the disk; thread-safe, lock-free)."""
    for path, rel, length in spans:
        load_span(path, rel, length)


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
