"""The values a client hands in and gets back: messages, send results, consumed records.

`Message` is what a producer sends, `SendResult` what the broker acknowledged,
`ConsumerRecord` what a consumer receives (built from a stored record exactly
as the broker served it), and `TopicQueue` names one queue of a topic on one
broker: queues are numbered per broker, so the broker name is part of the key.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple


class TopicQueue(NamedTuple):
    """One queue of a topic: (topic, broker name, queue id). Sorts by all three."""

    topic: str
    broker: str
    queue_id: int

    def __str__(self) -> str:
        return f"{self.topic}@{self.broker}#{self.queue_id}"


@dataclass(frozen=True, slots=True)
class Message:
    """A message to send: its body and the optional key(s), tags and user properties.

    `key` is the one key used for ordering (hashing to a queue); `keys` are
    extra index keys. Both are stored space-separated in the record's keys.
    """

    body: bytes
    key: str | None = None
    keys: tuple[str, ...] = ()
    tags: str | None = None
    properties: Mapping[str, str] = field(default_factory=dict)

    def all_keys(self) -> str:
        """The record's keys field: `key` first, then `keys`, space-separated."""
        parts = ([self.key] if self.key else []) + [k for k in self.keys if k]
        for part in parts:
            if " " in part:
                raise ValueError(f"message keys may not contain spaces: {part!r}")
        return " ".join(parts)


@dataclass(frozen=True, slots=True)
class SendResult:
    """Where the broker stored one message."""

    msg_id: str          # 32 upper-case hex characters
    topic: str
    queue_id: int
    queue_offset: int
    broker: str          # broker name

    @property
    def topic_queue(self) -> TopicQueue:
        return TopicQueue(self.topic, self.broker, self.queue_id)


@dataclass(frozen=True, slots=True)
class ConsumerRecord:
    """One consumed message, as stored by the broker."""

    body: bytes
    topic: str
    queue_id: int
    queue_offset: int
    msg_id: str
    key: str | None
    keys: tuple[str, ...]
    tags: str | None
    properties: Mapping[str, str]
    born_ts_ms: int
    store_ts_ms: int
    reconsume_times: int
    broker: str

    @property
    def topic_queue(self) -> TopicQueue:
        return TopicQueue(self.topic, self.broker, self.queue_id)

    @classmethod
    def from_stored(cls, stored: Any, broker: str) -> ConsumerRecord:
        """Build from a `ferry.store.StoredMessage` (what decode_record returns)."""
        keys = tuple(k for k in (stored.keys or "").split(" ") if k)
        msg_id = stored.msg_id.hex().upper() if isinstance(stored.msg_id, bytes | bytearray) \
            else str(stored.msg_id)
        return cls(
            body=bytes(stored.body),
            topic=stored.topic,
            queue_id=stored.queue_id,
            queue_offset=stored.queue_offset,
            msg_id=msg_id,
            key=keys[0] if keys else None,
            keys=keys,
            tags=stored.tags or None,
            properties=dict(stored.properties),
            born_ts_ms=stored.born_ts_ms,
            store_ts_ms=stored.store_ts_ms,
            reconsume_times=stored.reconsume_times,
            broker=broker,
        )
