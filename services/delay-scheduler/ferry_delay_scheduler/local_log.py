"""The term's local log: a `ferry.store` MessageStore caching every message it took over.

The record codec comes from `ferry.codec`. A %SCHEDULE% record pulled from a broker is appended here (topic
`%SCHEDULE%`, queue 0, same message id, tags, keys, body and flags) with
`ORIGIN_OFFSET` = "<broker>/<queue_id>/<queue_offset>" and, when the record
was a retry, `RECONSUME_TIMES` added to its properties. It is a cache of one
leadership term (term.py): the brokers' %SCHEDULE% keeps every record until it
is settled (progress.py), and the next term starts on an empty directory.

Retention: the store deletes commit-log segments by age only, and the age is
longer than the longest delay; the disk watermark is switched off (a usage
function that reports 0), since deleting a pending message would drop it from
the cache.
"""
from __future__ import annotations

import asyncio
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from ferry.codec import (
    DELIVER_AT_MS,
    ORIGIN_OFFSET,
    RECONSUME_TIMES,
    MessageIn,
    StoredMessage,
    decode_properties,
    decode_record,
    encode_properties,
)
from ferry.names import SCHEDULE_TOPIC
from ferry.store import FlushMode, MessageStore, StoreConfig
from ferry.telemetry import inject

if TYPE_CHECKING:
    from opentelemetry.context import Context

LOCAL_QUEUE = 0
# The scheduler's index holds one id entry and a few key entries per message: far
# smaller tables than a broker's keep its mapped pages (and so its RSS) small.
INDEX_MAX_SLOTS = 1_000_000
INDEX_MAX_ENTRIES = 4_000_000
SCAN_BATCH = 1000


class Stored(NamedTuple):
    """Where one taken-over message went: its due time, local store time and phy offset."""

    due_ms: int
    stored_ms: int
    phy_offset: int


def origin_of(broker: str, queue_id: int, queue_offset: int) -> str:
    return f"{broker}/{queue_id}/{queue_offset}"


def parse_origin(value: str) -> tuple[str, int, int] | None:
    """(broker, queue_id, queue_offset) of an ORIGIN_OFFSET value, or None when malformed."""
    broker, _, rest = value.rpartition("/")
    broker, _, qid = broker.rpartition("/")
    try:
        return broker, int(qid), int(rest)
    except ValueError:
        return None


def due_of(props: dict[str, str], fallback_ms: int) -> int:
    """DELIVER_AT_MS of a message; a missing or bad value means "due now" (never lost)."""
    try:
        return int(props[DELIVER_AT_MS])
    except (KeyError, ValueError):
        return fallback_ms


def _no_disk_pressure(_: str) -> float:
    return 0.0


class LocalLog:
    """The local MessageStore and the few operations the scheduler needs from it."""

    def __init__(self, root: Path, *, segment_bytes: int, flush_interval_ms: int,
                 retention_hours: float) -> None:
        self.store = MessageStore(StoreConfig(
            root_dir=str(root), commitlog_segment_bytes=segment_bytes,
            flush_mode=FlushMode.ASYNC, flush_interval_ms=flush_interval_ms,
            retention_hours=retention_hours, disk_usage_fn=_no_disk_pressure,
            index_max_slots=INDEX_MAX_SLOTS, index_max_entries=INDEX_MAX_ENTRIES,
            warm_ahead_bytes=0, store_host="delay-scheduler"))

    def append(self, broker: str, records: list[StoredMessage],
               trace: Mapping[int, Context] | None = None) -> tuple[list[Stored], int]:
        """Append records pulled from `broker`'s %SCHEDULE%; where each went, and the end offset.

        `trace`: by index in `records`, the `schedule` span context a traced record's
        local copy carries instead of the one it came with (see `tracing`)."""
        msgs = []
        dues = []
        for i, rec in enumerate(records):
            props = dict(rec.properties)
            if trace and i in trace:
                inject(props, trace[i])
            props[ORIGIN_OFFSET] = origin_of(broker, rec.queue_id, rec.queue_offset)
            if rec.reconsume_times > 0:
                props[RECONSUME_TIMES] = str(rec.reconsume_times)
            dues.append(due_of(props, rec.store_ts_ms))
            msgs.append(MessageIn(
                SCHEDULE_TOPIC, LOCAL_QUEUE, rec.body, rec.tags, rec.keys,
                encode_properties(props), rec.msg_id, rec.flags, rec.born_ts_ms,
                rec.born_host, rec.reconsume_times))
        results = self.store.put_batch(msgs)
        stored = [Stored(due, r.store_ts_ms, r.phy_offset) for due, r in zip(dues, results, strict=True)]
        return stored, results[-1].end_offset if results else 0

    async def durable(self, end_offset: int) -> None:
        """Wait until the local commit log is fdatasync'd up to `end_offset`."""
        await asyncio.wrap_future(self.store.wait_durable(end_offset))

    def read(self, phy: int) -> StoredMessage | None:
        """The decoded (CRC-checked) local record at `phy`, or None when none valid is there."""
        return self.store.get_message(phy)

    def find(self, msg_id: bytes) -> list[StoredMessage]:
        """The local copies of a message id, newest first (a retried message has several)."""
        found = self.store.query_by_id(msg_id)
        return [] if found is None else [found]

    @property
    def next_queue_offset(self) -> int:
        return self.store.max_offset(SCHEDULE_TOPIC, LOCAL_QUEUE)

    def scan(self, from_queue_offset: int) -> Iterator[tuple[int, StoredMessage]]:
        """Every local record from a queue offset on, with its queue offset (recovery)."""
        offset = max(from_queue_offset, self.store.min_offset(SCHEDULE_TOPIC, LOCAL_QUEUE))
        while True:
            got = self.store.get_messages(SCHEDULE_TOPIC, LOCAL_QUEUE, offset, SCAN_BATCH,
                                          16 << 20)
            if not got.records:
                return
            for raw in got.records:
                rec = decode_record(raw)
                yield rec.queue_offset, rec
            offset = got.next_queue_offset

    def close(self) -> None:
        self.store.close()


def record_due(rec: StoredMessage) -> int:
    return due_of(decode_properties(rec.properties_raw), rec.store_ts_ms)
