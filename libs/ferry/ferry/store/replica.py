"""Replication groundwork (issue 9): the commit log as raw bytes from one store to another.

A master streams its commit log to a slave as it is on disk (`read_log`); the
slave appends those bytes unchanged at its own end (`check_chunk`, then
`write_chunk`), so both logs are byte-identical and every phy offset means the
same record on both sides. The unit of a chunk is a record or an end-of-segment
marker (whose zeros up to the segment end travel with it, so offsets stay
identical; this needs the same `commitlog_segment_bytes` on both sides, which
the marker check enforces). A chunk never crosses a segment end: it stops after
a marker. Truncation (`MessageStore.truncate_to`) uses CommitLog.cut.

No network and no threads here: the broker's replication service moves the
chunks; MessageStore wraps these functions under its lock.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

from ferry.codec.record import BLANK_MAGIC, SIZE_MAGIC
from ferry.errors import StoreError

from .checkpoint import Checkpoint, read_checkpoint, write_checkpoint
from .commit_log import CommitLog
from .consume_queue import ConsumeQueues
from .dispatch import PendingDispatch, add_record, check_unit
from .index_file import IndexService

#: Largest `max_bytes` a read_log call may ask for (a chunk is held in memory twice).
MAX_READ_LOG_BYTES = 64 << 20


class Unit(NamedTuple):
    """One record or end-of-segment marker of a chunk: where it is in the chunk."""

    off: int
    size: int
    blank: bool


class CheckedChunk(NamedTuple):
    """A replicated chunk that passed every check, ready to be written."""

    start: int  # commit-log offset of its first byte (the slave's end when checked)
    end: int
    units: list[Unit]
    dispatch: PendingDispatch  # its consume-queue entries and index keys
    next_queue_offset: dict[tuple[str, int], int]  # of each queue it adds to
    last_store_ts_ms: int  # 0 when it holds no record


def read_log(cl: CommitLog, from_phy: int, max_bytes: int) -> bytes:
    """Raw commit-log bytes from the unit starting at `from_phy`, whole units only.

    At most `max_bytes`, but at least one unit when there is data past `from_phy`;
    never past the end of `from_phy`'s segment; b"" at the end of the log. Every
    unit read is checked (CRC, its own offset): a damaged one ends the chunk before
    it, and a chunk asked to start at one raises StoreError, as does an offset
    outside [commit_log_min_offset, commit_log_max_offset] or not at a unit start.
    """
    if not 0 < max_bytes <= MAX_READ_LOG_BYTES:
        raise StoreError(f"read_log: max_bytes must be in 1..{MAX_READ_LOG_BYTES}, "
                         f"got {max_bytes}")
    end = cl.write_offset
    if from_phy == end:
        return b""
    seg = cl.segment_for(from_phy)
    if seg is None or not cl.min_offset <= from_phy < end:
        raise StoreError(f"read_log: offset {from_phy} is outside the commit log "
                         f"[{cl.min_offset}, {end}]")
    view = seg.read_view
    rel = pos = from_phy - seg.start_offset
    stop = min(seg.end_offset, end) - seg.start_offset
    while pos < stop:
        problem = check_unit(view, pos, seg.size - pos, seg.start_offset + pos)
        if problem is not None:
            if pos == rel:
                raise StoreError(f"read_log: no valid record starts at {from_phy}: {problem}")
            break  # serve what is good; the next call names the problem
        size, magic = SIZE_MAGIC.unpack_from(view, pos)
        if pos > rel and pos + size - rel > max_bytes:
            break
        pos += size
        if magic == BLANK_MAGIC:
            break
    return bytes(view[rel:pos])


def check_chunk(cl: CommitLog, next_queue_offset: Mapping[tuple[str, int], int],
                phy_offset: int, data: bytes | bytearray | memoryview) -> CheckedChunk:
    """Check a chunk from a master before anything is written; raise StoreError if bad.

    `phy_offset` must be this log's end. Each unit is checked where it will land
    (size, magic, CRC, part lengths, its own phy offset, room in the segment; a
    marker must fill its segment), the chunk must end on a unit boundary and hold
    at most one marker, its last unit, and each record must carry the next queue
    offset of its queue (`next_queue_offset`: the appender's), so that the
    consume queues stay gapless and identical to the master's.
    """
    if phy_offset != cl.write_offset:
        raise StoreError(f"append_replicated at offset {phy_offset}, but this commit log "
                         f"ends at {cl.write_offset}")
    buf = memoryview(data).cast("B") if not isinstance(data, bytes) else data
    seg_bytes = cl.segment_bytes
    batch = PendingDispatch()
    next_qoff: dict[tuple[str, int], int] = {}
    units: list[Unit] = []
    off, last_ts = 0, 0
    while off < len(buf):
        pos = phy_offset + off
        if units and units[-1].blank:
            raise StoreError(f"replicated chunk goes on past an end-of-segment marker at {pos}")
        problem = check_unit(buf, off, seg_bytes - pos % seg_bytes, pos)
        if problem is not None:
            raise StoreError(f"replicated chunk refused, nothing written: {problem}")
        size, magic = SIZE_MAGIC.unpack_from(buf, off)
        blank = magic == BLANK_MAGIC
        if not blank:
            head = add_record(batch, buf, off, pos)
            key = (head.topic, head.queue_id)
            want = next_qoff.get(key, next_queue_offset.get(key, 0))
            if head.queue_offset != want:
                raise StoreError(
                    f"replicated chunk refused, nothing written: the record at {pos} has "
                    f"queue offset {head.queue_offset} of {head.topic}/{head.queue_id}, this "
                    f"store expects {want} (the logs diverge)")
            next_qoff[key] = want + 1
            last_ts = max(last_ts, head.store_ts_ms)
        units.append(Unit(off, size, blank))
        off += size
    return CheckedChunk(phy_offset, phy_offset + off, units, batch, next_qoff, last_ts)


def write_chunk(cl: CommitLog, data: bytes | bytearray | memoryview, chunk: CheckedChunk) -> None:
    """Write a checked chunk as it is, sealing the segment at its marker; publish its end.

    As on the put path, the write position is published only past bytes already
    written (at a roll, then at the chunk's end).
    """
    mv = memoryview(data).cast("B")
    seg = cl.active()
    rel = chunk.start - seg.start_offset
    if not 0 <= rel < seg.size:
        raise StoreError(f"the active segment does not hold offset {chunk.start}")
    done = 0
    for unit in chunk.units:
        if unit.blank:
            seg.write(mv[done:unit.off + unit.size], rel)
            # roll re-packs the same marker at the same place and opens the next segment
            seg = cl.roll(seg, rel + unit.off - done)
            done, rel = unit.off + unit.size, 0
    if len(mv) > done:
        seg.write(mv[done:], rel)
    cl.advance(chunk.end)


def check_boundary(cl: CommitLog, phy_offset: int) -> None:
    """Raise StoreError unless a valid unit starts at `phy_offset`, below the log end."""
    end = cl.write_offset
    seg = cl.segment_for(phy_offset)
    problem = None if seg is None else check_unit(
        seg.read_view, phy_offset - seg.start_offset, seg.end_offset - phy_offset, phy_offset)
    if seg is None or not cl.min_offset <= phy_offset < end or problem is not None:
        raise StoreError(f"truncate_to: {phy_offset} is not the start of a record in "
                         f"[{cl.min_offset}, {end}]" + (f" ({problem})" if problem else ""))


def cut_store(root_dir: str, cl: CommitLog, cqs: ConsumeQueues, index: IndexService,
              phy_offset: int) -> None:
    """Drop everything from the unit boundary `phy_offset` on, durably (truncate_to's work;
    the caller holds the store and checkpoint locks and has applied the dispatch).

    The checkpoint is lowered first: a crash before the cut then recovers the whole
    old log, one after it scans from below the cut and stops at its zeros. Were the
    old checkpoint kept, recovery would start past the cut and find zeros there: a
    hole in the log.
    """
    prev = read_checkpoint(root_dir)
    write_checkpoint(root_dir, Checkpoint(
        min(prev.commit_offset if prev else 0, cl.flushed_offset, phy_offset),
        min(prev.dispatch_offset if prev else 0, phy_offset), False))
    cl.cut(phy_offset)
    cqs.truncate_from_phy(phy_offset)
    index.drop_from(phy_offset)
