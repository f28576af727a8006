"""Recovery on open: find where valid data ends and bring queues and index in line with it.

Clean stop (the checkpoint says so and the log ends where it says): trust it and
start at once. Otherwise (a crash, a missing or damaged checkpoint): scan the
commit log from the checkpoint's durable offset, verifying every record (size
bounds, magic, CRC, part lengths, its own phy offset), cut the log at the first
record that fails (logging what was cut), drop consume-queue entries and index
keys that point past the checkpoint's dispatch offset, and re-dispatch the
records after it. A record that fails its check is never served.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from ferry.codec.record import (
    AT_PHY_OFFSET,
    AT_STORE_TS_MS,
    BLANK_MAGIC,
    BLANK_SIZE,
    I64,
    SIZE_MAGIC,
    U32,
    check_record,
)
from ferry.errors import CorruptRecordError

from .checkpoint import Checkpoint, read_checkpoint
from .commit_log import CommitLog
from .consume_queues import ConsumeQueues
from .dispatch import redispatch
from .index_file import IndexService

log = logging.getLogger(__name__)



@dataclass(frozen=True)
class RecoveryReport:
    """What opening the store found and did."""

    clean: bool
    write_offset: int
    scanned_from: int
    records_scanned: int
    cut_reason: str | None
    redispatched_from: int
    records_redispatched: int
    last_store_ts_ms: int
    duration_ms: float


@dataclass(frozen=True)
class _Scan:
    end: int
    problem: str | None
    records: int
    last_store_ts_ms: int


def recover(root_dir: str, cl: CommitLog, cqs: ConsumeQueues, index: IndexService) -> RecoveryReport:
    """Recover the three structures in place and position the commit log for appends."""
    t0 = time.perf_counter()
    cp = read_checkpoint(root_dir)
    if cp is not None and cp.clean and _clean_end_ok(cl, cp.commit_offset):
        cl.set_positions(cp.commit_offset)
        return RecoveryReport(True, cp.commit_offset, cp.commit_offset, 0, None,
                              cp.commit_offset, 0, _last_store_ts(cl, cqs),
                              (time.perf_counter() - t0) * 1000)
    scan_from = _trusted_offset(cl, cp)
    scan = _scan(cl, scan_from)
    if scan.problem is not None:
        log.warning("recovery: commit log cut at offset %d: %s; the bytes after it are discarded",
                    scan.end, scan.problem)
    cl.truncate(scan.end)
    cl.set_positions(scan.end)
    cq_from = max(min(cp.dispatch_offset if cp else 0, scan.end), cl.min_offset)
    cqs.truncate_from_phy(cq_from)
    index_from = max(min(index.truncate_from_phy(cq_from), cq_from), cl.min_offset)
    start = min(cq_from, index_from)
    done = redispatch(cl, cqs, index, start, scan.end, cq_from, index_from, scan_from)
    end, problem = scan.end, scan.problem
    if done.problem is not None:
        # Bit rot below the checkpoint: the next record boundary is unknown, so the log
        # ends there, like a torn tail (queues and index are cut to match).
        log.error("recovery: record at offset %d, below the checkpoint, fails its check (%s); "
                  "the commit log is cut there and the %d bytes after it are discarded",
                  done.end, done.problem, scan.end - done.end)
        end, problem = done.end, done.problem
        cl.truncate(end)
        cl.set_positions(end)
        cqs.truncate_from_phy(end)
        index.drop_from(end)
    last_ts = (scan.last_store_ts_ms if done.problem is None else 0) or _last_store_ts(cl, cqs)
    report = RecoveryReport(False, end, scan_from, scan.records, problem, start, done.records,
                            last_ts, (time.perf_counter() - t0) * 1000)
    log.info("recovery after an unclean stop: %s", report)
    return report


def _trusted_offset(cl: CommitLog, cp: Checkpoint | None) -> int:
    """Where verification starts: the checkpoint's durable offset if it is plausible."""
    segs = cl.segments
    if not segs:
        return 0
    if cp is None or not segs[0].start_offset <= cp.commit_offset <= segs[-1].end_offset:
        if cp is not None:
            log.warning("recovery: checkpoint offset %d is outside the commit log, scanning it all",
                        cp.commit_offset)
        return segs[0].start_offset
    return cp.commit_offset


def _clean_end_ok(cl: CommitLog, offset: int) -> bool:
    """After a clean close nothing follows the checkpointed end; check that it is so."""
    segs = cl.segments
    if not segs:
        return offset == 0
    if offset == segs[-1].end_offset:
        return True
    seg = cl.segment_for(offset)
    if seg is None or seg is not segs[-1]:
        return False
    rel = offset - seg.start_offset
    return rel + U32.size <= seg.size and U32.unpack_from(seg.view, rel)[0] == 0


def _scan(cl: CommitLog, start: int) -> _Scan:
    """Verify records from `start`; stop at the end of data or the first bad record."""
    pos = start
    records = last_ts = 0
    while True:
        seg = cl.segment_for(pos)
        if seg is None:
            return _Scan(pos, None, records, last_ts)
        rel = pos - seg.start_offset
        view = seg.view
        if rel + BLANK_SIZE > seg.size:
            return _Scan(pos, "no room for an end-of-segment marker", records, last_ts)
        size, magic = SIZE_MAGIC.unpack_from(view, rel)
        if size == 0 and magic == 0:
            return _Scan(pos, None, records, last_ts)
        if magic == BLANK_MAGIC:
            if rel + size != seg.size:
                return _Scan(pos, f"end-of-segment marker of size {size} does not reach the end",
                             records, last_ts)
            pos = seg.end_offset
            continue
        try:
            size = check_record(view, rel, seg.size - BLANK_SIZE)
        except CorruptRecordError as exc:
            return _Scan(pos, str(exc), records, last_ts)
        claimed = I64.unpack_from(view, rel + AT_PHY_OFFSET)[0]
        if claimed != pos:
            return _Scan(pos, f"record claims phy offset {claimed}", records, last_ts)
        last_ts = I64.unpack_from(view, rel + AT_STORE_TS_MS)[0]
        pos += size
        records += 1


def _last_store_ts(cl: CommitLog, cqs: ConsumeQueues) -> int:
    """Store time of the newest record any queue points to (0 when none)."""
    phy = cqs.max_last_phy()
    if phy < 0:
        return 0
    seg = cl.segment_for(phy)
    if seg is None:
        return 0
    rel = phy - seg.start_offset
    try:
        check_record(seg.view, rel, seg.size)
    except CorruptRecordError:
        return 0
    return int(I64.unpack_from(seg.view, rel + AT_STORE_TS_MS)[0])
