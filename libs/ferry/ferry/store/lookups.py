"""Lookups that are not a pull: a queue offset by store time, messages by key.

Both answer from an index (a consume queue's entries, the index file's keys) and
then check the records they lead to in the commit log, so a stale or colliding
index entry never answers. MessageStore calls them under its lock; finding by id
is id_index.py.
"""
from __future__ import annotations

from ferry.codec.record import AT_STORE_TS_MS, HEADER_SIZE, I64, StoredMessage

from .commit_log import CommitLog
from .consume_queue import ConsumeQueue
from .index_file import IndexService
from .index_keys import message_key
from .reader import read_message

# Index candidates read beyond max_count: spare room for hash collisions.
KEY_QUERY_SPARE = 16


def offset_for_timestamp(cl: CommitLog, cq: ConsumeQueue, ts_ms: int) -> int:
    """The first queue offset of `cq` stored at or after ts_ms (max_offset when none is)."""
    lo, hi = cq.min_offset, cq.max_offset
    while lo < hi:  # store timestamps never decrease along a queue
        mid = (lo + hi) // 2
        entry = cq.get(mid, 1)
        head = cl.read(entry[0][0], HEADER_SIZE) if entry else None
        if head is None or I64.unpack_from(head, AT_STORE_TS_MS)[0] < ts_ms:
            lo = mid + 1
        else:
            hi = mid
    return lo


def find_by_key(cl: CommitLog, index: IndexService, topic: str, key: str, begin_ms: int,
                end_ms: int, max_count: int) -> list[StoredMessage]:
    """Messages of `topic` carrying `key` (one key: no space), stored in [begin_ms, end_ms],
    newest first, at most max_count; each record checked against all three."""
    phys = index.query(message_key(topic.encode(), key.encode()), begin_ms, end_ms,
                       max_count + KEY_QUERY_SPARE)
    out: list[StoredMessage] = []
    for phy in phys:
        msg = read_message(cl, phy)
        if (msg is not None and msg.topic == topic and key in msg.keys.split(" ")
                and begin_ms <= msg.store_ts_ms <= end_ms):
            out.append(msg)
            if len(out) >= max_count:
                break
    return out
