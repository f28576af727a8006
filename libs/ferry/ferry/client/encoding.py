"""The producer's message encoding (checks, wire forms, SEND-batch bytes) and its SendResults.

Kept apart from `producer` so that module holds the sending logic only. Bad
input raises here, before anything is queued, so it can never fail a batch
that other messages share.
"""
from __future__ import annotations

import time
from asyncio import Future, InvalidStateError
from collections import deque
from collections.abc import Mapping, Sequence
from itertools import repeat

from ferry.client.accumulator import Entry, Pending, PendingGroup, PendingMessage, PendingRun
from ferry.client.message import Message, SendResult, TopicQueue
from ferry.codec import DELIVER_AT_MS, TRACEPARENT, TTL_MS, MessageFlag
from ferry.codec.entry import ENTRY_HEAD_SIZE, append_plain_entries
from ferry.codec.limits import MAX_BODY_BYTES, MAX_KEYS_BYTES, MAX_TAGS_BYTES
from ferry.codec.msg_id import new_msg_id
from ferry.codec.properties import encode_properties
from ferry.errors import InvalidDelayError, MalformedRequestError, MessageTooLargeError
from ferry.wire import Frame, WireMessage, encode_messages

MAX_MESSAGE_BYTES = MAX_BODY_BYTES
HEAD_SIZE = ENTRY_HEAD_SIZE
#: The longest delay a producer accepts unless configured otherwise (the broker and the
#: delay scheduler enforce their own maximum too).
DEFAULT_MAX_DELAY_MS = 30 * 24 * 3600 * 1000
_DELAY = int(MessageFlag.DELAY)
_TTL = int(MessageFlag.TTL)
_TRACED = int(MessageFlag.TRACED)
#: Builds a SendResult without the NamedTuple's Python-level __new__ (a fourth of its cost):
#: `_result(SendResult, (msg_id, topic, queue_id, queue_offset, broker))`.
_result = tuple.__new__
_hex, _upper = bytes.hex, str.upper
_SET_RESULT = Future.set_result
_consume = deque[object](maxlen=0).extend   # runs an iterator to its end, in C


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


def encode_run(run: PendingRun) -> list[bytes]:
    """The SEND-batch entries of a run's plain messages as pieces to join, made (with
    their ids) once."""
    if not run.msg_ids:
        msg_ids: list[bytes] = []
        parts: list[bytes] = []
        append_plain_entries(parts, msg_ids, run.bodies, run.born_ts_ms)
        run.msg_ids = msg_ids
        run.parts = parts
    return run.parts


def live_entries(items: list[Entry]) -> list[Entry]:
    """The entries of a batch still to send: without those whose future is done (cancelled)."""
    if len(items) == 1:   # the common case: one run, or one group
        item = items[0]
        if isinstance(item, PendingRun):
            return [item] if item.prune() else []
        return [] if item.future.done() else [item]
    return [it for it in items
            if (it.prune() if isinstance(it, PendingRun) else not it.future.done())]


def entries_body(items: list[Entry]) -> bytes:
    """The SEND body of `items`: their entries' bytes back to back, joined once."""
    if len(items) == 1:
        item = items[0]
        if isinstance(item, PendingRun):
            return b"".join(encode_run(item))
        if isinstance(item, PendingGroup) and item.parts:
            return b"".join(item.parts)
        return item.encoded
    parts: list[bytes] = []
    for it in items:
        if isinstance(it, PendingRun):
            parts += encode_run(it)
        elif isinstance(it, PendingGroup) and it.parts:
            parts += it.parts
        else:
            parts.append(it.encoded)
    return b"".join(parts)


def split_runs(items: list[Entry], topic: str) -> list[Pending]:
    """`items` with each run split into one `PendingMessage` per message still waiting.

    A failed SEND's messages are retried (or failed) one by one; each keeps
    its id and its bytes.
    """
    if not any(isinstance(it, PendingRun) for it in items):
        return items  # type: ignore[return-value]
    out: list[Pending] = []
    for it in items:
        if not isinstance(it, PendingRun):
            out.append(it)
            continue
        encoded = b"".join(encode_run(it))
        start = 0
        for body, msg_id, fut in zip(it.bodies, it.msg_ids, it.futures, strict=True):
            end = start + HEAD_SIZE + len(body)
            if not fut.done():
                out.append(PendingMessage(WireMessage(body, msg_id, it.born_ts_ms), fut, topic,
                                          encoded=encoded[start:end]))
            start = end
    return out


def group_results(group: PendingGroup, tq: TopicQueue, queue_id: int,
                  first: int) -> list[SendResult]:
    """The SendResults of a group stored from queue offset `first` (-1: unknown)."""
    topic, broker = tq.topic, tq.broker
    if first < 0:
        return [_result(SendResult, (m.hex().upper(), topic, queue_id, -1, broker))
                for m in group.msg_ids]
    return [_result(SendResult, (m.hex().upper(), topic, queue_id, offset, broker))
            for m, offset in zip(group.msg_ids, range(first, first + len(group.msg_ids)),
                                 strict=True)]


def _complete_run(run: PendingRun, tq: TopicQueue, queue_id: int, first: int) -> None:
    """Resolve a run's futures: its messages were stored from queue offset `first` (-1: unknown).

    The SendResults are built and handed over by C-level iteration (`map`),
    the run's hottest loop; a future cancelled meanwhile (or a loop whose
    futures are no asyncio.Future) takes the careful loop instead.
    """
    topic, broker = tq.topic, tq.broker
    count = len(run.futures)
    offsets = range(first, first + count) if first >= 0 else repeat(-1, count)
    results = map(_result, repeat(SendResult), zip(
        map(_upper, map(_hex, run.msg_ids)), repeat(topic), repeat(queue_id), offsets,
        repeat(broker)))
    try:
        _consume(map(_SET_RESULT, run.futures, results))
        return
    except (InvalidStateError, TypeError):
        pass
    offsets = range(first, first + count) if first >= 0 else repeat(-1, count)
    for msg_id, fut, offset in zip(run.msg_ids, run.futures, offsets):  # noqa: B905 - repeat
        if not fut.done():
            fut.set_result(_result(SendResult, (msg_id.hex().upper(), topic, queue_id, offset,
                                                broker)))


def complete(tq: TopicQueue, items: list[Entry], resp: Frame) -> None:
    """Resolve each item's future from the SEND answer (first queue offset, then one each)."""
    first = int(resp.fields.get("queue_offset", -1))
    queue_id = int(resp.fields.get("queue_id", tq.queue_id))
    offsets = resp.fields.get("offsets")
    if offsets is not None:   # a flagged batch: each entry's own offset, -1 if redirected
        complete_each(tq, items, queue_id, offsets)
        return
    offset = first
    for it in items:
        if isinstance(it, PendingRun):
            _complete_run(it, tq, queue_id, offset)
        elif not it.future.done():
            if isinstance(it, PendingGroup):
                it.future.set_result(group_results(it, tq, queue_id, offset))
            else:
                it.future.set_result(_result(SendResult, (
                    it.wire.msg_id.hex().upper(), tq.topic, queue_id, offset, tq.broker)))
        if first >= 0:
            offset += it.count


def complete_each(tq: TopicQueue, items: list[Entry], queue_id: int,
                  offsets: Sequence[int]) -> None:
    """Resolve futures from a flagged SEND's per-message `offsets` (-1: delayed, not yet stored).

    A delayed message's SendResult names the user's topic and the queue it was
    sent to; its queue offset is -1 until it is delivered there.
    """
    def at(i: int) -> int:
        return int(offsets[i]) if i < len(offsets) else -1

    i = 0
    for it in items:
        if isinstance(it, PendingRun):
            for k, (msg_id, fut) in enumerate(zip(it.msg_ids, it.futures, strict=True)):
                if not fut.done():
                    fut.set_result(SendResult(msg_id.hex().upper(), tq.topic, queue_id, at(i + k),
                                              tq.broker))
        elif not it.future.done():
            if isinstance(it, PendingGroup):
                ids = b"".join(it.msg_ids).hex().upper()
                it.future.set_result([
                    SendResult(ids[32 * k:32 * k + 32], tq.topic, queue_id, at(i + k), tq.broker)
                    for k in range(it.count)])
            else:
                it.future.set_result(SendResult(it.wire.msg_id.hex().upper(), tq.topic,
                                                queue_id, at(i), tq.broker))
        i += it.count
