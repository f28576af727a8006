"""The producer's message encoding (checks, wire forms, SEND-batch bytes) and its SendResults.

Kept apart from `producer` so that module holds the sending logic only. Bad
input raises here, before anything is queued, so it can never fail a batch
that other messages share.
"""
from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

from ferry.client.accumulator import Pending, PendingGroup
from ferry.client.message import Message, SendResult, TopicQueue
from ferry.codec.entry import ENTRY_HEAD, ENTRY_HEAD_SIZE
from ferry.codec.limits import MAX_BODY_BYTES, MAX_KEYS_BYTES, MAX_TAGS_BYTES
from ferry.codec.msg_id import new_msg_id
from ferry.codec.properties import encode_properties
from ferry.errors import MalformedRequestError, MessageTooLargeError
from ferry.wire import Frame, WireMessage, encode_messages

MAX_MESSAGE_BYTES = MAX_BODY_BYTES
HEAD_SIZE = ENTRY_HEAD_SIZE
pack_head = ENTRY_HEAD.pack


def check_body(body: object) -> None:
    if not isinstance(body, bytes | bytearray | memoryview):
        raise TypeError(f"message body must be bytes, not {type(body).__name__}")
    if len(body) > MAX_MESSAGE_BYTES:
        raise MessageTooLargeError(
            f"message body is {len(body)} bytes; the limit is {MAX_MESSAGE_BYTES}")


def to_wire(msg: Message) -> WireMessage:
    """The wire form of a message; bad fields raise here, before they could fail a batch."""
    return make_wire(msg.body, msg.key, msg.keys, msg.tags, msg.properties)


def make_wire(body: bytes, key: str | None, keys: tuple[str, ...], tags: str | None,
              properties: Mapping[str, str] | None, msg_id: bytes = b"",
              born_ts_ms: int = 0) -> WireMessage:
    props = encode_properties(dict(properties)) if properties else b""
    tags = tags or ""
    all_keys = Message(b"", key, keys).all_keys() if key or keys else ""
    if len(tags.encode()) > MAX_TAGS_BYTES or len(all_keys.encode()) > MAX_KEYS_BYTES:
        raise MalformedRequestError(f"tags and keys are limited to {MAX_TAGS_BYTES} bytes each")
    return WireMessage(body=bytes(body), msg_id=msg_id or new_msg_id(),
                       born_ts_ms=born_ts_ms or int(time.time() * 1000), tags=tags,
                       keys=all_keys, properties=props)


def encode_group(msgs: Sequence[Message]) -> tuple[list[bytes], bytes]:
    """The ids and the SEND-batch bytes of `msgs`, encoded in one pass.

    A message with no key, tags or properties (the common case) is packed here
    directly; others go through the full encoder. Bad input raises before
    anything is queued.
    """
    born_ts_ms = int(time.time() * 1000)
    msg_ids: list[bytes] = []
    parts: list[bytes] = []
    for msg in msgs:
        body = msg.body
        if type(body) is not bytes:
            check_body(body)
            body = bytes(body)
        size = len(body)
        if size > MAX_MESSAGE_BYTES:
            check_body(body)
        msg_id = new_msg_id()
        msg_ids.append(msg_id)
        if msg.key or msg.keys or msg.tags or msg.properties:
            parts.append(encode_messages([make_wire(body, msg.key, msg.keys, msg.tags,
                                                    msg.properties, msg_id, born_ts_ms)]))
        else:
            parts.append(pack_head(HEAD_SIZE + size, msg_id, born_ts_ms, 0, 0, 0, 0, size))
            parts.append(body)
    return msg_ids, b"".join(parts)


def group_results(group: PendingGroup, tq: TopicQueue, queue_id: int,
                  first: int) -> list[SendResult]:
    """The SendResults of a group stored from queue offset `first` (-1: unknown)."""
    ids = b"".join(group.msg_ids).hex().upper()
    topic, broker = tq.topic, tq.broker
    if first < 0:
        return [SendResult(ids[32 * i:32 * i + 32], topic, queue_id, -1, broker)
                for i in range(len(group.msg_ids))]
    return [SendResult(ids[32 * i:32 * i + 32], topic, queue_id, first + i, broker)
            for i in range(len(group.msg_ids))]


def complete(tq: TopicQueue, items: list[Pending], resp: Frame) -> None:
    """Resolve each item's future from the SEND answer (first queue offset, then one each)."""
    first = int(resp.fields.get("queue_offset", -1))
    queue_id = int(resp.fields.get("queue_id", tq.queue_id))
    offset = first
    for it in items:
        if not it.future.done():
            if isinstance(it, PendingGroup):
                it.future.set_result(group_results(it, tq, queue_id, offset))
            else:
                it.future.set_result(SendResult(
                    msg_id=it.wire.msg_id.hex().upper(), topic=tq.topic, queue_id=queue_id,
                    queue_offset=offset, broker=tq.broker))
        if first >= 0:
            offset += it.count
