"""The producer's message encoding: checks, wire forms, SEND-batch bytes (see also `pending`).

Kept apart from `producer` so that module holds the sending logic only. Bad
input raises here, before anything is queued, so it can never fail a batch
that other messages share.
"""
from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

from ferry.client.core.message import Message
from ferry.codec import DELIVER_AT_MS, TRACEPARENT, TTL_MS, MessageFlag
from ferry.codec.entry import ENTRY_HEAD_SIZE, append_plain_entries
from ferry.codec.limits import MAX_BODY_BYTES, MAX_KEYS_BYTES, MAX_TAGS_BYTES
from ferry.codec.msg_id import new_msg_id
from ferry.codec.properties import encode_properties
from ferry.errors import InvalidDelayError, MalformedRequestError, MessageTooLargeError
from ferry.wire import WireMessage, encode_messages

MAX_MESSAGE_BYTES = MAX_BODY_BYTES
HEAD_SIZE = ENTRY_HEAD_SIZE
#: The longest delay a producer accepts unless configured otherwise (the broker and the
#: delay scheduler enforce their own maximum too).
DEFAULT_MAX_DELAY_MS = 30 * 24 * 3600 * 1000
_DELAY = int(MessageFlag.DELAY)
_TTL = int(MessageFlag.TTL)
_TRACED = int(MessageFlag.TRACED)


def trace_flag(properties: Mapping[str, str]) -> int:
    """TRACED for a message whose properties carry trace context (the producer put it there)."""
    return _TRACED if TRACEPARENT in properties else 0


def check_body(body: object) -> None:
    if not isinstance(body, bytes | bytearray | memoryview):
        raise TypeError(f"message body must be bytes, not {type(body).__name__}")
    if len(body) > MAX_MESSAGE_BYTES:
        raise MessageTooLargeError(
            f"message body is {len(body)} bytes; the limit is {MAX_MESSAGE_BYTES}")


def _whole_ms(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidDelayError(f"{what} must be an integer number of milliseconds, got {value!r}")
    return value


def timing(delay_ms: int | None, deliver_at_ms: int | None, ttl_ms: int | None,
           max_delay_ms: int, now_ms: int) -> tuple[dict[str, str], int]:
    """The system properties and flags for a message's delay and time to live.

    `delay_ms` 0 means no delay (as a `deliver_at_ms` at or before now does:
    the message is sent as a plain one and delivered now); a negative delay,
    or one beyond `max_delay_ms`, raises InvalidDelayError. `ttl_ms` 0 (or
    None) means the message never expires.
    """
    props: dict[str, str] = {}
    flags = 0
    if delay_ms is not None:
        if deliver_at_ms is not None:
            raise ValueError("give delay_ms or deliver_at_ms, not both")
        if _whole_ms(delay_ms, "delay_ms") < 0:
            raise InvalidDelayError(f"delay_ms must be >= 0, got {delay_ms}")
        deliver_at_ms = now_ms + delay_ms if delay_ms else None
    if deliver_at_ms is not None:
        if _whole_ms(deliver_at_ms, "deliver_at_ms") < 0:
            raise InvalidDelayError(f"deliver_at_ms must be epoch ms >= 0, got {deliver_at_ms}")
        if deliver_at_ms - now_ms > max_delay_ms:
            raise InvalidDelayError(
                f"a delay of {deliver_at_ms - now_ms} ms is beyond the maximum of "
                f"{max_delay_ms} ms ({max_delay_ms / 86_400_000:g} days)")
        if deliver_at_ms > now_ms:
            props[DELIVER_AT_MS] = str(deliver_at_ms)
            flags |= _DELAY
    if ttl_ms is not None:
        if _whole_ms(ttl_ms, "ttl_ms") < 0:
            raise InvalidDelayError(f"ttl_ms must be >= 0, got {ttl_ms}")
        if ttl_ms:
            props[TTL_MS] = str(ttl_ms)
            flags |= _TTL
    return props, flags


def to_wire(msg: Message, max_delay_ms: int = DEFAULT_MAX_DELAY_MS) -> WireMessage:
    """The wire form of a message; bad fields raise here, before they could fail a batch."""
    traced = trace_flag(msg.properties) if msg.properties else 0
    if msg.delay_ms is None and msg.deliver_at_ms is None and msg.ttl_ms is None:
        return make_wire(msg.body, msg.key, msg.keys, msg.tags, msg.properties, flags=traced)
    born_ts_ms = int(time.time() * 1000)
    extra, flags = timing(msg.delay_ms, msg.deliver_at_ms, msg.ttl_ms, max_delay_ms, born_ts_ms)
    return make_wire(msg.body, msg.key, msg.keys, msg.tags, {**msg.properties, **extra},
                     born_ts_ms=born_ts_ms, flags=flags | traced)


def make_wire(body: bytes, key: str | None, keys: tuple[str, ...], tags: str | None,
              properties: Mapping[str, str] | None, msg_id: bytes = b"",
              born_ts_ms: int = 0, flags: int = 0) -> WireMessage:
    props = encode_properties(dict(properties)) if properties else b""
    tags = tags or ""
    all_keys = Message(b"", key, keys).all_keys() if key or keys else ""
    if len(tags.encode()) > MAX_TAGS_BYTES or len(all_keys.encode()) > MAX_KEYS_BYTES:
        raise MalformedRequestError(f"tags and keys are limited to {MAX_TAGS_BYTES} bytes each")
    return WireMessage(body=bytes(body), msg_id=msg_id or new_msg_id(),
                       born_ts_ms=born_ts_ms or int(time.time() * 1000), flags=flags,
                       tags=tags, keys=all_keys, properties=props)


def encode_group(msgs: Sequence[Message], max_delay_ms: int = DEFAULT_MAX_DELAY_MS
                 ) -> tuple[list[bytes], list[bytes], int, int]:
    """The ids, the SEND-batch entries (as pieces to join), their size and the OR of the
    flags of `msgs`, encoded in one pass.

    Messages with no key, tags, properties, delay or TTL (the common case) are
    packed in runs by `append_plain_entries`; others go through the full encoder.
    Bad input raises before anything is queued.
    """
    born_ts_ms = int(time.time() * 1000)
    msg_ids: list[bytes] = []
    parts: list[bytes] = []
    plain: list[bytes] = []   # the bodies of the plain messages not yet packed
    all_flags = 0
    nbytes = 0
    for msg in msgs:
        body = msg.body
        if type(body) is not bytes:
            check_body(body)
            body = bytes(body)
        if len(body) > MAX_MESSAGE_BYTES:
            check_body(body)
        if (msg.delay_ms is None and msg.deliver_at_ms is None and msg.ttl_ms is None
                and not (msg.key or msg.keys or msg.tags or msg.properties)):
            plain.append(body)
            continue
        if plain:   # ids stay in message order
            nbytes += _append_plain(parts, msg_ids, plain, born_ts_ms)
            plain = []
        msg_id = new_msg_id()
        msg_ids.append(msg_id)
        properties = msg.properties
        flags = trace_flag(properties)
        if msg.delay_ms is not None or msg.deliver_at_ms is not None or msg.ttl_ms is not None:
            extra, timed = timing(msg.delay_ms, msg.deliver_at_ms, msg.ttl_ms, max_delay_ms,
                                  born_ts_ms)
            properties, flags = {**properties, **extra}, flags | timed
        all_flags |= flags
        entry = encode_messages([make_wire(body, msg.key, msg.keys, msg.tags, properties,
                                           msg_id, born_ts_ms, flags)])
        parts.append(entry)
        nbytes += len(entry)
    if plain:
        nbytes += _append_plain(parts, msg_ids, plain, born_ts_ms)
    return msg_ids, parts, nbytes, all_flags


def _append_plain(parts: list[bytes], msg_ids: list[bytes], bodies: list[bytes],
                  born_ts_ms: int) -> int:
    """append_plain_entries; the bytes it added."""
    append_plain_entries(parts, msg_ids, bodies, born_ts_ms)
    return HEAD_SIZE * len(bodies) + sum(map(len, bodies))
