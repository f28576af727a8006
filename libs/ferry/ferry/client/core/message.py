"""The values a client hands in and gets back: messages, send results, consumed records.

`Message` is what a producer sends, `SendResult` what the broker acknowledged,
`ConsumerRecord` what a consumer receives (built from a stored record exactly
as the broker served it), and `TopicQueue` names one queue of a topic on one
broker: queues are numbered per broker, so the broker name is part of the key.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from operator import itemgetter
from typing import TYPE_CHECKING, Any, NamedTuple

from ferry.codec.msg_id import msg_id_hex
from ferry.codec.properties import decode_properties
from ferry.codec.record import (
    H_BODY_LEN,
    H_BORN_TS_MS,
    H_FLAGS,
    H_KEYS_LEN,
    H_MSG_ID,
    H_PHY_OFFSET,
    H_PREPARED_OFFSET,
    H_PROPS_LEN,
    H_QUEUE_ID,
    H_QUEUE_OFFSET,
    H_RECONSUME_TIMES,
    H_STORE_TS_MS,
    H_TAG_HASH,
    H_TAGS_LEN,
    HEADER_FIELDS,
)


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
    `delay_ms` / `deliver_at_ms` (epoch ms), `ttl_ms`, `priority` (0..3)
    and `trace` (True: traced, False: never, None: sampled) are as for
    `Producer.send`.
    """

    body: bytes
    key: str | None = None
    keys: tuple[str, ...] = ()
    tags: str | None = None
    properties: Mapping[str, str] = field(default_factory=dict)
    delay_ms: int | None = None
    deliver_at_ms: int | None = None
    ttl_ms: int | None = None
    priority: int = 0
    trace: bool | None = None

    def all_keys(self) -> str:
        """The record's keys field: `key` first, then `keys`, space-separated."""
        parts = ([self.key] if self.key else []) + [k for k in self.keys if k]
        for part in parts:
            if " " in part:
                raise ValueError(f"message keys may not contain spaces: {part!r}")
        return " ".join(parts)


class SendResult(NamedTuple):
    """Where the broker stored one message.

    A NamedTuple (immutable like a frozen dataclass, a third of its build
    cost): a producer builds one per message acknowledged.
    """

    msg_id: str          # 32 upper-case hex characters
    topic: str
    queue_id: int
    queue_offset: int
    broker: str          # broker name

    @property
    def topic_queue(self) -> TopicQueue:
        return TopicQueue(self.topic, self.broker, self.queue_id)


_new_tuple = tuple.__new__


class ConsumerRecord(tuple):  # no __slots__: the instance dict caches decoded fields
    """One consumed message, as stored by the broker.

    A consumer builds hundreds of thousands of these per second, so a record
    is a tuple (building one costs a tenth of a frozen dataclass) that keeps
    the stored header and the few bytes of tags, keys and properties as they
    arrived: `msg_id`, `key`, `keys`, `tags` and `properties` are decoded on
    first use (and cached), and nothing is decoded twice. The body is copied
    out once, so a record does not keep its whole PULL response alive.
    Immutable like a frozen dataclass; read it by attribute, not by index.
    """

    # Tuple slots: the eight public fields in the order of the attributes below,
    # then the stored header (unpacked with ferry.codec.record.HEADER: read it with the
    # H_* field indices) and the raw tags | keys | properties bytes; and only for a
    # record read from `%RETRY%<group>`: that stored topic (the `topic` slot then
    # holds the topic the message was first consumed from).
    if TYPE_CHECKING:
        body: bytes                 # the message body
        topic: str
        queue_id: int               # the queue id (per broker)
        queue_offset: int           # the offset in its queue
        born_ts_ms: int             # the producer's clock at send
        store_ts_ms: int            # the broker's clock at store
        reconsume_times: int        # redeliveries so far
        broker: str                 # the broker name
    else:  # C-level getters: several times cheaper than Python properties
        body = property(itemgetter(0))
        topic = property(itemgetter(1))
        queue_id = property(itemgetter(2))
        queue_offset = property(itemgetter(3))
        born_ts_ms = property(itemgetter(4))
        store_ts_ms = property(itemgetter(5))
        reconsume_times = property(itemgetter(6))
        broker = property(itemgetter(7))

    @classmethod
    def _make(cls, body: bytes, topic: str, broker: str, header: tuple[Any, ...],
              meta: bytes) -> ConsumerRecord:
        """Build from a decoded stored header and the raw tags | keys | properties bytes."""
        return _new_tuple(cls, (body, topic, header[H_QUEUE_ID], header[H_QUEUE_OFFSET],
                                header[H_BORN_TS_MS], header[H_STORE_TS_MS],
                                header[H_RECONSUME_TIMES], broker, header, meta))

    def _cached(self, name: str) -> Any:
        return self.__dict__.get(name, _MISSING)

    @property
    def msg_id(self) -> str:
        """The message id as 32 upper-case hex characters."""
        value = self._cached("msg_id")
        if value is _MISSING:
            value = self.__dict__["msg_id"] = msg_id_hex(self[_HEADER][H_MSG_ID])
        return value  # type: ignore[no-any-return]

    @property
    def tags(self) -> str | None:
        value = self._cached("tags")
        if value is _MISSING:
            value = self.__dict__["tags"] = \
                self[_META][:self[_HEADER][H_TAGS_LEN]].decode() or None
        return value  # type: ignore[no-any-return]

    @property
    def keys(self) -> tuple[str, ...]:
        """Every key of the record (space-separated in the store)."""
        value = self._cached("keys")
        if value is _MISSING:
            header = self[_HEADER]
            tags_end = header[H_TAGS_LEN]
            raw = self[_META][tags_end:tags_end + header[H_KEYS_LEN]].decode()
            value = self.__dict__["keys"] = tuple(k for k in raw.split(" ") if k)
        return value  # type: ignore[no-any-return]

    @property
    def key(self) -> str | None:
        """The first key (the one used for ordering), if any."""
        keys = self.keys
        return keys[0] if keys else None

    @property
    def properties(self) -> Mapping[str, str]:
        value = self._cached("properties")
        if value is _MISSING:
            header = self[_HEADER]
            value = self.__dict__["properties"] = decode_properties(
                self[_META][header[H_TAGS_LEN] + header[H_KEYS_LEN]:])
        return value  # type: ignore[no-any-return]

    @property
    def stored_topic(self) -> str:
        """The topic the record was read from: `%RETRY%<group>` for a retried message
        (whose `topic` is the one it was first consumed from), else `topic`."""
        return self[_STORED_TOPIC] if len(self) > _STORED_TOPIC else self[1]  # type: ignore[no-any-return]

    @property
    def topic_queue(self) -> TopicQueue:
        """The queue the record was read from (its position is an offset there)."""
        return TopicQueue(self.stored_topic, self[7], self[2])

    def with_topic(self, topic: str) -> ConsumerRecord:
        """The same record shown under `topic`, keeping where it was stored."""
        return _new_tuple(ConsumerRecord, (*self[:1], topic, *self[2:_STORED_TOPIC], self.stored_topic))

    def with_reconsume_times(self, times: int) -> ConsumerRecord:
        """The same record as attempt `times` (an ordered consumer retries in place)."""
        return _new_tuple(ConsumerRecord, (*self[:_RECONSUME], times, *self[_RECONSUME + 1:]))

    @classmethod
    def from_stored(cls, stored: Any, broker: str) -> ConsumerRecord:
        """Build from a `ferry.codec.record.StoredMessage` (what decode_record returns)."""
        tags_b, keys_b = stored.tags.encode(), stored.keys.encode()
        header: list[Any] = [0] * len(HEADER_FIELDS)
        for index, value in ((H_FLAGS, stored.flags), (H_QUEUE_ID, stored.queue_id),
                             (H_QUEUE_OFFSET, stored.queue_offset),
                             (H_PHY_OFFSET, stored.phy_offset), (H_BORN_TS_MS, stored.born_ts_ms),
                             (H_STORE_TS_MS, stored.store_ts_ms),
                             (H_PREPARED_OFFSET, stored.prepared_offset),
                             (H_RECONSUME_TIMES, stored.reconsume_times),
                             (H_TAG_HASH, stored.tag_hash), (H_MSG_ID, bytes(stored.msg_id)),
                             (H_TAGS_LEN, len(tags_b)), (H_KEYS_LEN, len(keys_b)),
                             (H_PROPS_LEN, len(stored.properties_raw)),
                             (H_BODY_LEN, len(stored.body))):
            header[index] = value
        return cls._make(bytes(stored.body), stored.topic, broker, tuple(header),
                         tags_b + keys_b + bytes(stored.properties_raw))

    def _fields(self) -> tuple[Any, ...]:
        """The public fields, for equality: how a record was built does not matter."""
        return (*self[:_HEADER], self.msg_id, self.keys, self.tags, dict(self.properties),
                self.stored_topic)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ConsumerRecord):
            return NotImplemented
        return self._fields() == other._fields()

    def __ne__(self, other: object) -> bool:
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq

    def __hash__(self) -> int:
        return hash((*self[:_HEADER], self.msg_id))

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"ConsumerRecord is immutable (cannot set {name!r})")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"ConsumerRecord is immutable (cannot delete {name!r})")

    def __repr__(self) -> str:
        stored = f", stored_topic={self[_STORED_TOPIC]!r}" if len(self) > _STORED_TOPIC else ""
        return (f"ConsumerRecord(topic={self.topic!r}{stored}, broker={self.broker!r}, "
                f"queue_id={self.queue_id}, queue_offset={self.queue_offset}, "
                f"msg_id={self.msg_id!r}, key={self.key!r}, tags={self.tags!r}, "
                f"born_ts_ms={self.born_ts_ms}, store_ts_ms={self.store_ts_ms}, "
                f"reconsume_times={self.reconsume_times}, body={self.body[:64]!r}"
                f"{'...' if len(self.body) > 64 else ''})")

    def __reduce__(self) -> tuple[Any, ...]:
        return (_new_tuple, (ConsumerRecord, tuple(self)))


_MISSING = object()
_RECONSUME = 6       # the reconsume_times slot
# Tuple slots after the eight public fields.
_HEADER = 8
_META = 9
_STORED_TOPIC = 10   # only in a record read from %RETRY%<group>
