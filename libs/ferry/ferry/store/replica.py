"""Replication groundwork (issue 9): the commit log as raw bytes from one store to another.

A master streams its commit log to a slave as it is on disk (`read_log`); the
slave appends those bytes unchanged at its own end (`check_chunk`, then
`write_chunk`), so both logs are byte-identical and every phy offset means the
same record on both sides. The unit of a chunk is a record or an end-of-segment
marker (whose zeros up to the segment end travel with it, so offsets stay
identical; this needs the same `commitlog_segment_bytes` on both sides, which
the marker check enforces). A chunk never crosses a segment end: it stops after
a marker. Truncation (`MessageStore.truncate_to`) uses CommitLog.cut.

Who verifies what: the SLAVE checks every unit in full before it writes anything
(`check_chunk`: size, magic, CRC, part lengths, own offset, room, queue offsets);
the master's `read_log` checks the first unit in full (a bad start offset is
named there) and walks the rest by size and magic only. Both loops run once per
record, on the two cores the producer uses too, so each does only what is
needed (see docs/replication.md "Benchmarks").

No network and no threads here: the broker's replication service moves the
chunks; MessageStore wraps these functions under its lock.
"""
from __future__ import annotations

import os
import struct
from collections.abc import Mapping
from typing import NamedTuple

from ferry.codec.record import (
    BLANK_MAGIC,
    BLANK_SIZE,
    H_PHY_OFFSET,
    H_QUEUE_ID,
    H_QUEUE_OFFSET,
    H_STORE_TS_MS,
    H_TAG_HASH,
    H_TOPIC_LEN,
    HEADER,
    HEADER_LAYOUT,
    HEADER_SIZE,
    RECORD_MAGIC,
    SIZE_MAGIC,
    check_records,
)
from ferry.errors import CorruptRecordError, StoreError

from .checkpoint import Checkpoint, read_checkpoint, write_checkpoint
from .commit_log import CommitLog
from .consume_queue import CQ_ENTRY
from .consume_queues import ConsumeQueues
from .dispatch import PendingDispatch, check_unit
from .encode_context import QueueEntries
from .index_file import IndexService
from .index_keys import key_prefix_crc
from .mapped_file import MappedFile

#: Largest `max_bytes` a read_log call may ask for (a chunk is held in memory twice).
MAX_READ_LOG_BYTES = 64 << 20
#: Byte offset of `topic_len` in a record header (the topic follows the header).
AT_TOPIC_LEN = struct.calcsize("<" + "".join(code for _, code in HEADER_LAYOUT[:H_TOPIC_LEN]))
#: The smallest room a record needs: its header and a marker's worth after it.
_MIN_RECORD_ROOM = HEADER_SIZE + BLANK_SIZE

_pack_entry = CQ_ENTRY.pack
_size_magic = SIZE_MAGIC.unpack_from
# unpack_from of a header followed by its topic, one per topic length (at most 256).
# A header followed by its topic, one per topic length (at most 256).
_head_topic: dict[int, struct.Struct] = {}


def _head_topic_layout(topic_len: int) -> struct.Struct:
    layout = _head_topic.get(topic_len)
    if layout is None:
        layout = _head_topic[topic_len] = struct.Struct(f"{HEADER.format}{topic_len}s")
    return layout


class CheckedChunk(NamedTuple):
    """A replicated chunk that passed every check, ready to be written."""

    start: int  # commit-log offset of its first byte (the slave's end when checked)
    end: int
    marker_at: int  # position in the chunk of its end-of-segment marker (the last unit), or -1
    dispatch: PendingDispatch  # its consume-queue entries and index keys
    next_queue_offset: dict[tuple[str, int], int]  # of each queue it adds to
    last_store_ts_ms: int  # 0 when it holds no record


class _Run:
    """The records a chunk adds to one queue: checked to carry consecutive queue offsets."""

    __slots__ = ("topic_b", "queue_id", "key", "first", "next", "entries", "key_crc")

    def __init__(self, topic_b: bytes, key: tuple[str, int], first: int) -> None:
        self.topic_b = topic_b
        self.queue_id = key[1]
        self.key = key
        self.first = first
        self.next = first  # the queue offset the next record must carry
        self.entries: list[bytes] = []  # packed CQ_ENTRY of each record
        self.key_crc = key_prefix_crc(topic_b)


_NO_RUN = _Run(b"", ("", -1), 0)  # matches no record (queue ids are >= 0)


def read_log(cl: CommitLog, from_phy: int, max_bytes: int) -> bytes:
    """Raw commit-log bytes from the unit starting at `from_phy`, whole units only.

    At most `max_bytes`, but at least one unit when there is data past `from_phy`;
    never past the end of `from_phy`'s segment; b"" at the end of the log. The
    first unit is checked in full (CRC, its own offset): StoreError if it fails, as
    for an offset outside [commit_log_min_offset, commit_log_max_offset] or not at
    a unit start.

    The units after the first are not checked here, and mostly not even walked:
    when the rest of the log (or of its segment) fits in `max_bytes` it is whole
    units as it is (the log end is published only past whole units, and a sealed
    segment ends with its marker), so a slave that keeps up costs the master one
    copy per chunk and no per-record work. Only a chunk cut short by `max_bytes`
    walks the units by size and magic to end on a boundary; an impossible size or
    magic ends it before that unit (the next call, starting there, names it).

    Why the CRCs are not re-computed here: the slave checks every unit in full
    before it writes a byte (`check_chunk`), so a damaged record never reaches a
    slave's log; it is refused there, with its offset logged, and replication
    stops at that chunk (as it stopped at that record before). Those records were
    CRC-checked when this store wrote them (it encoded them, or check_chunk let
    them in) and by recovery's scan after a crash. Checking here too doubled the
    per-record work on the master for no added safety.
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
    rel = from_phy - seg.start_offset
    problem = check_unit(view, rel, seg.size - rel, from_phy)
    if problem is not None:
        raise StoreError(f"read_log: no valid record starts at {from_phy}: {problem}")
    size, magic = _size_magic(view, rel)
    pos = rel + size
    stop = min(seg.end_offset, end) - seg.start_offset
    if magic == BLANK_MAGIC:
        return bytes(view[rel:pos])  # a marker ends its segment: a chunk of its own
    if stop - rel <= max_bytes:
        return _copy(seg, rel, max(pos, stop))  # the rest: whole units as it is
    return _copy(seg, rel, _walk(view, pos, rel + max_bytes, seg.size))


def _copy(seg: MappedFile, rel: int, stop: int) -> bytes:
    """The bytes [rel, stop) of a segment, read with pread: the writer filled those pages
    with pwrite, so a copy out of the mapping would first fault each page into it."""
    data = os.pread(seg.fd, stop - rel, rel)
    return data if len(data) == stop - rel else bytes(seg.read_view[rel:stop])


def _walk(view: memoryview, pos: int, limit: int, seg_size: int) -> int:
    """The end of the last whole unit from `pos` that ends by `limit` (sizes and magics
    only: an impossible one ends the walk before it)."""
    while pos < limit:
        size, magic = _size_magic(view, pos)
        nxt = pos + size
        if magic == RECORD_MAGIC:
            if size < HEADER_SIZE or nxt > limit:
                break
            pos = nxt
        else:
            # a marker fills its segment (the log goes on in the next one)
            if magic == BLANK_MAGIC and nxt == seg_size and nxt <= limit:
                pos = nxt
            break
    return pos

def check_chunk(cl: CommitLog, next_queue_offset: Mapping[tuple[str, int], int],
                phy_offset: int, data: bytes | bytearray | memoryview) -> CheckedChunk:
    """Check a chunk from a master before anything is written; raise StoreError if bad.

    `phy_offset` must be this log's end. Each unit is checked where it will land
    (size, magic, CRC, part lengths, its own phy offset, room in the segment; a
    marker must fill its segment), the chunk must end on a unit boundary and hold
    at most one marker, its last unit, and each record must carry the next queue
    offset of its queue (`next_queue_offset`: the appender's), so that the
    consume queues stay gapless and identical to the master's.

    One loop does the checks (a record's own: `check_records`) and collects the
    dispatch (consume-queue entries, index keys) from one unpack per record: it runs
    for every replicated record. A unit that does not end in room for a marker or
    does not name its own offset is judged again by `check_unit`, which names the
    problem (or it is a marker).
    """
    if phy_offset != cl.write_offset:
        raise StoreError(f"append_replicated at offset {phy_offset}, but this commit log "
                         f"ends at {cl.write_offset}")
    buf = data if isinstance(data, bytes) else memoryview(data).cast("B")
    mv = memoryview(buf)  # CRC slices of it are views, not copies
    n = len(buf)
    seg_bytes = cl.segment_bytes
    room_end = seg_bytes - phy_offset % seg_bytes  # where the segment ends, in the chunk
    fast_end = min(n, room_end - BLANK_SIZE)  # a record must end by here
    runs: dict[tuple[bytes, int], _Run] = {}
    run = _NO_RUN  # the last record's queue (a batch's records share one)
    heads = _head_topic
    batch = PendingDispatch()
    items, add_keys = batch.index_items, batch.id_runs.add
    off = last_ts = 0
    marker_at = -1
    while off < n:
        pos = phy_offset + off
        if off + _MIN_RECORD_ROOM <= room_end and off + HEADER_SIZE <= n:
            size, magic = _size_magic(buf, off)
            tl = buf[off + AT_TOPIC_LEN]
            nxt = off + size
            if magic == RECORD_MAGIC and nxt <= fast_end and HEADER_SIZE + tl <= size:
                try:
                    h = check_records(mv, off, nxt, heads.get(tl) or _head_topic_layout(tl))[0]
                except CorruptRecordError as exc:
                    raise StoreError(f"replicated chunk refused, nothing written: {exc} "
                                     f"(commit-log offset {pos})") from None
                if h[H_PHY_OFFSET] == pos:
                    if h[H_QUEUE_ID] != run.queue_id or h[-1] != run.topic_b:
                        run = runs.get((h[-1], h[H_QUEUE_ID])) or _new_run(
                            runs, h[-1], h[H_QUEUE_ID], next_queue_offset, pos)
                    if h[H_QUEUE_OFFSET] != run.next:
                        raise _diverged(pos, h[H_QUEUE_OFFSET], run)
                    run.next += 1
                    run.entries.append(_pack_entry(pos, size, h[H_TAG_HASH]))
                    ts = h[H_STORE_TS_MS]
                    if ts > last_ts:
                        last_ts = ts
                    add_keys(items, h, buf, off, run.key_crc, pos)
                    off = nxt
                    continue
        # A marker, or a unit that failed a fast check: judged in full.
        marker_at, off = off, off + _marker_size(buf, off, room_end, pos)
    batch.queues = {run.key: QueueEntries(run.first, run.entries) for run in runs.values()}
    return CheckedChunk(phy_offset, phy_offset + off, marker_at, batch,
                        {run.key: run.next for run in runs.values()}, last_ts)


def _marker_size(buf: bytes | memoryview, off: int, room_end: int, pos: int) -> int:
    """The size of the end-of-segment marker at `off`, which must end the chunk: else the
    StoreError that names what is wrong with the unit there."""
    problem = check_unit(buf, off, room_end - off, pos)
    if problem is not None:
        raise StoreError(f"replicated chunk refused, nothing written: {problem}")
    size, magic = _size_magic(buf, off)
    if magic != BLANK_MAGIC:  # (cannot be: a valid record passes the fast checks)
        raise StoreError(f"replicated chunk refused, nothing written: the record at {pos} "
                         "failed a check")
    if off + size < len(buf):
        raise StoreError(f"replicated chunk refused, nothing written: it goes on past an "
                         f"end-of-segment marker at {pos + size}")
    return int(size)


def _new_run(runs: dict[tuple[bytes, int], _Run], topic_b: bytes, queue_id: int,
             next_queue_offset: Mapping[tuple[str, int], int], pos: int) -> _Run:
    """The first record of a chunk in a queue: where that queue stands in this store."""
    try:
        topic = topic_b.decode()
    except UnicodeDecodeError:
        raise StoreError(f"replicated chunk refused, nothing written: the record at {pos} "
                         "has a topic that is not UTF-8") from None
    key = (topic, queue_id)
    run = runs[(topic_b, queue_id)] = _Run(topic_b, key, next_queue_offset.get(key, 0))
    return run


def _diverged(pos: int, queue_offset: int, run: _Run) -> StoreError:
    topic, queue_id = run.key
    return StoreError(
        f"replicated chunk refused, nothing written: the record at {pos} has queue offset "
        f"{queue_offset} of {topic}/{queue_id}, this store expects {run.next} (the logs diverge)")


def write_chunk(cl: CommitLog, data: bytes | bytearray | memoryview, chunk: CheckedChunk) -> None:
    """Write a checked chunk as it is, sealing the segment at its marker; publish its end.

    As on the put path, the write position is published only past bytes already
    written (at a roll, then at the chunk's end). A marker is a chunk's last unit,
    so the whole chunk is one write.
    """
    mv = memoryview(data).cast("B")
    seg = cl.active()
    rel = chunk.start - seg.start_offset
    if not 0 <= rel < seg.size:
        raise StoreError(f"the active segment does not hold offset {chunk.start}")
    seg.write(mv, rel)
    if chunk.marker_at >= 0:
        # roll re-packs the same marker at the same place and opens the next segment
        cl.roll(seg, rel + chunk.marker_at)
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
