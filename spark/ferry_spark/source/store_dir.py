"""The offline read: a broker's data directory (a copy, or a stopped broker's) through ferry.store.

Planning opens the store once for the topic's queues and bounds; each Spark
task opens it again for its range and reads with `get_messages`, records in
the same layout a PULL answer carries. A store directory is locked by whoever
has it open: a running broker's directory is refused at planning (read a copy),
and the tasks of one read, which may run at once, take turns (each waits up to
`LOCK_WAIT_S` for the lock). Opening runs the store's recovery, so the copy may
be repaired (a torn tail cut) as a broker restarting on it would.
"""
from __future__ import annotations

import os
import time
from collections.abc import Iterator

from ferry.errors import OffsetOutOfRangeError, StoreError, TopicNotFoundError
from ferry.store import GetStatus, MessageStore, StoreConfig

from ferry_spark.errors import SourceOptionError
from ferry_spark.source.ranges import QueueBounds, QueueRange

LOCK_WAIT_S = 120.0
LOCK_RETRY_S = 0.2
READ_MAX_COUNT = 1024
READ_MAX_BYTES = 8 << 20


def broker_name(store_dir: str, broker: str | None) -> str:
    """The broker column of rows read from `store_dir`: the `broker` option, else the dir name."""
    return broker or os.path.basename(os.path.normpath(store_dir))


def _segment_bytes(store_dir: str) -> int:
    """The commit log's segment size, from its first segment (all are that long)."""
    cl_dir = os.path.join(store_dir, "commitlog")
    if not os.path.isdir(cl_dir):
        raise SourceOptionError(f"ferry source: {store_dir} is not a broker data directory "
                                f"(no commitlog/ in it)")
    names = sorted(n for n in os.listdir(cl_dir) if len(n) == 20 and n.isdigit())
    if not names:
        raise SourceOptionError(f"ferry source: the store in {store_dir} holds no commit log")
    return os.path.getsize(os.path.join(cl_dir, names[0]))


def open_store(store_dir: str, wait_s: float = 0.0) -> MessageStore:
    """The store in `store_dir`, opened for reading (no warming); waits `wait_s` for its lock."""
    config = StoreConfig(root_dir=store_dir, commitlog_segment_bytes=_segment_bytes(store_dir),
                         warm_ahead_bytes=0, retention_hours=1e9, flush_interval_ms=60_000,
                         checkpoint_interval_ms=60_000)
    deadline = time.monotonic() + wait_s
    while True:
        try:
            return MessageStore(config)
        except StoreError as exc:
            if "in use" not in str(exc):
                raise
            if time.monotonic() >= deadline:
                raise StoreError(f"ferry source: the store directory {store_dir} is in use (a "
                                 f"running broker?): read a copy of it, or stop its broker") \
                    from None
            time.sleep(LOCK_RETRY_S)


def store_bounds(store_dir: str, broker: str, topic: str, start_ts_ms: int | None,
                 end_ts_ms: int | None) -> list[QueueBounds]:
    """The bounds of each queue of `topic` held in `store_dir`."""
    store = open_store(store_dir)
    try:
        queue_ids = store.topic_queues().get(topic)
        if not queue_ids:
            raise TopicNotFoundError(f"ferry source: topic {topic!r} has no queue in the store "
                                     f"{store_dir}")

        def at(qid: int, ts: int | None) -> int | None:
            return None if ts is None else store.offset_for_timestamp(topic, qid, ts)

        return [QueueBounds(topic, broker, qid, store.min_offset(topic, qid),
                            store.max_offset(topic, qid),
                            at(qid, start_ts_ms), at(qid, end_ts_ms)) for qid in queue_ids]
    finally:
        store.close()


def read_store_range(store_dir: str, qr: QueueRange, *,
                     fail_out_of_range: bool) -> Iterator[bytes]:
    """The records of `qr` from the store in `store_dir`, a chunk of their bytes at a time
    (checked and decoded by `schema.records_batch`)."""
    store = open_store(store_dir, wait_s=LOCK_WAIT_S)
    try:
        offset = qr.start
        while offset < qr.end:
            got = store.get_messages(qr.topic, qr.queue_id, offset,
                                     min(READ_MAX_COUNT, qr.end - offset), READ_MAX_BYTES)
            if got.status is GetStatus.OFFSET_TOO_SMALL and not fail_out_of_range:
                offset = got.next_queue_offset
                continue
            if got.status not in (GetStatus.FOUND, GetStatus.NO_MATCHED_MESSAGE) \
                    or got.next_queue_offset <= offset:
                raise OffsetOutOfRangeError(
                    f"ferry source: {qr.where} in {store_dir}: offset {offset} cannot be read "
                    f"({got.status.name}; the queue holds [{got.min_offset}, {got.max_offset}))")
            offset = got.next_queue_offset
            if got.records:
                yield b"".join(got.records)
    finally:
        store.close()
