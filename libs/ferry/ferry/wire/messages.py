"""The SEND body: a batch of messages back to back, each a SEND entry.

The entry layout (a fixed 44-byte head, then tags, keys, properties and body)
is declared once, with its byte diagram, in `ferry.codec.entry`: the store
takes the same bytes as its batch input. Entries follow each other with no
padding; the batch ends where the frame body ends.
"""
from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

from ferry.codec.entry import ENTRY_HEAD, ENTRY_HEAD_SIZE, append_entry
from ferry.codec.limits import MAX_BODY_BYTES, MAX_KEYS_BYTES, MAX_TAGS_BYTES, MSG_ID_BYTES
from ferry.codec.msg_id import NO_MSG_ID
from ferry.errors import MalformedRequestError, MessageTooLargeError


@dataclass(slots=True)
class WireMessage:
    """One message as the producer sends it (the broker adds topic, queue and offsets).

    `properties` is already encoded as UTF-8 `key\\x01value\\x02` pairs
    (`ferry.codec.encode_properties`); `msg_id` is 16 bytes, or empty to let
    the broker assign one.
    """

    body: bytes
    msg_id: bytes
    born_ts_ms: int
    flags: int = 0
    tags: str = ""
    keys: str = ""
    properties: bytes = b""


def encode_messages(
    msgs: Sequence[WireMessage], max_body_bytes: int = MAX_BODY_BYTES
) -> bytes:
    """The SEND body for `msgs`.

    Raises MessageTooLargeError for a body over `max_body_bytes` and
    MalformedRequestError for a field that does not fit its slot.
    """
    parts: list[bytes] = []
    for msg in msgs:
        body = msg.body
        if len(body) > max_body_bytes:
            raise MessageTooLargeError(
                f"message body is {len(body)} bytes; the limit is {max_body_bytes}"
            )
        msg_id = msg.msg_id
        if msg_id and len(msg_id) != MSG_ID_BYTES:
            raise MalformedRequestError(f"msg_id must be {MSG_ID_BYTES} bytes, not {len(msg_id)}")
        tags = msg.tags.encode() if msg.tags else b""
        keys = msg.keys.encode() if msg.keys else b""
        if len(tags) > MAX_TAGS_BYTES or len(keys) > MAX_KEYS_BYTES:
            raise MalformedRequestError(
                f"tags and keys are limited to {MAX_TAGS_BYTES} UTF-8 bytes each")
        try:
            append_entry(parts, msg_id, msg.born_ts_ms, msg.flags, tags, keys, msg.properties,
                         body)
        except struct.error as exc:
            raise MalformedRequestError(f"message field out of range: {exc}") from None
    return b"".join(parts)


def decode_messages(
    body: bytes | bytearray | memoryview, max_body_bytes: int = MAX_BODY_BYTES
) -> list[WireMessage]:
    """The messages of a SEND body.

    Raises MalformedRequestError on a truncated or inconsistent entry and
    MessageTooLargeError on a message body over `max_body_bytes`. An empty
    body is an empty list (SEND itself refuses it).
    """
    data = body if type(body) is bytes else bytes(body)  # bytes slices are one copy each
    end = len(data)
    unpack_from = ENTRY_HEAD.unpack_from
    head_size = ENTRY_HEAD_SIZE
    out: list[WireMessage] = []
    append = out.append
    pos = 0
    while pos < end:
        if end - pos < head_size:
            raise MalformedRequestError(
                f"message batch truncated: {end - pos} bytes left at {pos}, an entry head is "
                f"{head_size}"
            )
        # The head's fields in ENTRY_HEAD_FIELDS order.
        length, msg_id, born_ts_ms, flags, tags_len, keys_len, props_len, body_len = (
            unpack_from(data, pos)
        )
        if body_len > max_body_bytes:
            raise MessageTooLargeError(
                f"message body is {body_len} bytes; the limit is {max_body_bytes}"
            )
        if length != head_size + tags_len + keys_len + props_len + body_len:
            raise MalformedRequestError(f"message at {pos}: entry length {length} disagrees "
                                        "with its field lengths")
        if length > end - pos:
            raise MalformedRequestError(
                f"message batch truncated: entry at {pos} needs {length} bytes, "
                f"{end - pos} left"
            )
        p = pos + head_size
        try:
            tags = data[p:p + tags_len].decode() if tags_len else ""
            p += tags_len
            keys = data[p:p + keys_len].decode() if keys_len else ""
        except UnicodeDecodeError:
            raise MalformedRequestError(f"message at {pos}: tags or keys are not UTF-8") from None
        p += keys_len
        props = data[p:p + props_len] if props_len else b""
        p += props_len
        append(WireMessage(
            data[p:p + body_len],
            b"" if msg_id == NO_MSG_ID else msg_id,
            born_ts_ms, flags, tags, keys, props,
        ))
        pos += length
    return out
