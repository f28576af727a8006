"""Per-message time to live: expired messages are never handed to a consumer.

A TTL-flagged message carries `TTL_MS`; it expires `TTL_MS` after it was stored
in its topic (for a delayed message: after it became deliverable). The TTL
hook validates the property and remembers the queue (`TtlQueues`, kept in a
small file so a restart knows too); PULL then checks the records it returns
from those queues only, so queues without TTL messages pay nothing. Expired
records are left out of the answer (the consumer's next offset moves past
them) and counted per topic for `/v1/stats`.
"""
from __future__ import annotations

import json
import struct
import time
from collections import Counter
from pathlib import Path

from ferry.atomic_file import replace_durably
from ferry.codec import TTL_MS, MessageFlag
from ferry.codec import record as layout
from ferry.codec.properties import decode_properties
from ferry.errors import MalformedRequestError

from ferry_broker.put_pipeline import PutBatch, PutHook

_TTL = int(MessageFlag.TTL)
_TXN_HALF = int(MessageFlag.TXN_HALF)
MAX_TTL_QUEUES = 100_000
_FLAGS = struct.Struct("<I")
# The record's parts before its properties.
_H_LENS = [layout.H_TOPIC_LEN, layout.H_BORN_HOST_LEN, layout.H_STORE_HOST_LEN,
           layout.H_TAGS_LEN, layout.H_KEYS_LEN]


def ttl_ms_of(props: dict[str, str]) -> int:
    raw = props.get(TTL_MS)
    try:
        ttl = int(raw) if raw is not None else 0
    except ValueError:
        ttl = 0
    if ttl <= 0:
        raise MalformedRequestError(f"a TTL message needs a positive {TTL_MS} property, "
                                    f"not {raw!r}")
    return ttl


class TtlQueues:
    """The queues that have held a TTL message, persisted as a JSON list."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._queues: set[tuple[str, int]] = set()
        if path.exists():
            for topic, queue_id in json.loads(path.read_text()):
                self._queues.add((str(topic), int(queue_id)))

    def __contains__(self, key: tuple[str, int]) -> bool:
        return key in self._queues

    def __bool__(self) -> bool:
        return bool(self._queues)

    def add(self, key: tuple[str, int]) -> None:
        """Remember a queue (written before the message is stored, so a crash cannot forget it)."""
        if key in self._queues:
            return
        if len(self._queues) >= MAX_TTL_QUEUES:
            raise MalformedRequestError(f"more than {MAX_TTL_QUEUES} queues hold TTL messages")
        self._queues.add(key)
        self._path.parent.mkdir(parents=True, exist_ok=True)
        replace_durably(self._path, json.dumps(sorted(self._queues)).encode())


class TtlHook(PutHook):
    """Checks TTL messages and remembers their queues."""

    def __init__(self, queues: TtlQueues) -> None:
        self._queues = queues

    def before_put(self, batch: PutBatch) -> None:
        for msg in batch.messages:
            if msg.flags & _TTL:
                ttl_ms_of(decode_properties(msg.properties))
                # A half's TTL starts when it is committed to its topic (the committed
                # message passes this hook again); `%HALF%` itself never expires records,
                # so the txn-checker sees every half.
                if not msg.flags & _TXN_HALF:
                    self._queues.add((msg.topic, msg.queue_id))


class ExpiryFilter:
    """Leaves expired records out of PULL answers and counts them per topic."""

    def __init__(self, queues: TtlQueues) -> None:
        self.queues = queues
        self.expired: Counter[str] = Counter()

    def live(self, topic: str, records: list[memoryview]) -> list[memoryview]:
        """The records not expired now (all of them when none carries a TTL)."""
        now_ms = int(time.time() * 1000)
        out: list[memoryview] | None = None
        for i, rec in enumerate(records):
            if not _FLAGS.unpack_from(rec, layout.AT_FLAGS)[0] & _TTL:
                if out is not None:
                    out.append(rec)
                continue
            h = layout.HEADER.unpack_from(rec, 0)
            start = layout.HEADER_SIZE + sum(h[j] for j in _H_LENS)
            try:
                ttl = ttl_ms_of(decode_properties(rec[start:start + h[layout.H_PROPS_LEN]]))
            except MalformedRequestError:
                ttl = 0
            if ttl and h[layout.H_STORE_TS_MS] + ttl > now_ms:
                if out is not None:
                    out.append(rec)
                continue
            if out is None:
                out = list(records[:i])
            self.expired[topic] += 1
        return records if out is None else out
