"""SEND_BACK: a consumer's nack. A copy of the message returns to the group later.

The request names a message this broker stores, not its content: the queue
the consumer read it from (`topic`, `queue_id`, `queue_offset`) and its
`msg_id`. The broker reads that record from its own store and refuses the
request (MessageNotFoundError) when no record with that id sits at that
offset; the body is empty. So `consume` on a group (with `sub` on the topic,
see permissions.py) lets a consumer send back only what it could read, with
the body as stored: never a message of its own making (issue 24).
`topic` is a topic the group reads: a user topic, the group's own
`%RETRY%<group>`, or (to resend dead letters) its `%DLQ%<group>`.

The copy keeps the message id, body, tags, keys and properties, and carries
`ORIGIN_TOPIC`, the topic the group first received it from, always set by the
broker: the stored topic for a user topic (a producer's own `ORIGIN_TOPIC`
property is overwritten), the stored property for a retry or dead-letter
record (set by this broker when it made that copy). Where it goes:
- `reconsume_times` beyond `max_reconsume_times`: `%DLQ%<group>`, for good;
- `delay_ms` 0: `%RETRY%<group>` at once (the group's consumers subscribe to it);
- otherwise `%SCHEDULE%`, bound for `%RETRY%<group>` once the back-off has
  passed (the delay scheduler delivers it, like any delayed message);
  `%RETRY%<group>` is created on this broker at once all the same, so that
  its route is out before the copy arrives (a new group's first retry comes
  within its back-off: the consumers look for that route after the nack).
Only the broker that stores the message accepts its SEND_BACK (RocketMQ's
consumerSendMessageBack goes to the message's broker too): a consumer whose
message's broker is down keeps the position uncommitted and tries again
until that broker (or its promoted slave, which holds the same log) is back,
so the message is delivered again rather than lost. The answer comes once the
copy is stored (and flushed, on a sync-flush broker): only then may the
consumer commit past the original.

Tracing: the optional `traceparent` (and `tracestate`) fields are the
consumer's `retry` span context. With them, the copy is TRACED and carries
that context, the broker makes a `retry` (or `dlq`) span (SERVER kind) as its
child, and the scheduler's and the next consumer's spans hang below the
consumer's `retry`. Without them the copy is untraced.
"""
from __future__ import annotations

import re
import time

from ferry.codec import (
    DELIVER_AT_MS,
    ORIGIN_TOPIC,
    REAL_QUEUE_ID,
    REAL_TOPIC,
    RECONSUME_TIMES,
    TRACEPARENT,
    TRACESTATE,
    MessageFlag,
    StoredMessage,
    decode_record,
    msg_id_hex,
)
from ferry.errors import (
    InvalidDelayError,
    InvalidNameError,
    MalformedRequestError,
    MessageNotFoundError,
)
from ferry.names import SCHEDULE_TOPIC, dlq_topic, is_internal, retry_topic
from ferry.store import MessageIn, MessageStore, decode_properties, encode_properties
from ferry.telemetry import extract, hop_span, tracing
from ferry.wire import Frame, response
from opentelemetry.trace import SpanKind

from ferry_broker.context import BrokerContext, ConnInfo
from ferry_broker.handlers.fields import (
    group_field,
    int_field,
    offset_field,
    queue_field,
    str_field,
    topic_field,
)
from ferry_broker.handlers.query import parse_msg_id

MAX_RECONSUME_TIMES = 10_000
MAX_TRACESTATE_CHARS = 512   # W3C: at most 32 list members; 512 is what propagators keep
# The copy's routing and trace context are decided here: an earlier trip's are dropped.
_ROUTING_PROPERTIES = (DELIVER_AT_MS, REAL_TOPIC, REAL_QUEUE_ID, RECONSUME_TIMES, TRACEPARENT,
                       TRACESTATE)
_TRACED = int(MessageFlag.TRACED)
_TRACEPARENT = re.compile(r"[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}")


def stored_at(store: MessageStore, topic: str, queue_id: int, queue_offset: int,
              msg_id: bytes) -> StoredMessage:
    """The record with `msg_id` at (topic, queue_id, queue_offset); MessageNotFoundError if none."""
    got = store.get_messages(topic, queue_id, queue_offset, max_count=1)
    if got.records:
        msg = decode_record(bytes(got.records[0]))  # a copy: the view is the commit log's
        if msg.queue_offset == queue_offset and msg.msg_id == msg_id:
            return msg
    raise MessageNotFoundError(f"no message {msg_id_hex(msg_id)} at {topic} queue {queue_id} "
                               f"offset {queue_offset} on this broker")


def _check_topic(topic: str, group: str) -> None:
    """Refuse an internal topic other than the group's own retry and dead-letter topics."""
    if is_internal(topic) and topic not in (retry_topic(group), dlq_topic(group)):
        raise InvalidNameError(f"SEND_BACK for group {group} names {topic}: a group sends "
                               f"back messages of user topics, its own retry or dead-letter "
                               f"topic only")


def _origin(topic: str, stored: StoredMessage) -> str | None:
    """The topic the group first received the message from, as the broker knows it."""
    if not is_internal(topic):
        return topic
    # The group's retry / dead-letter topic: this broker set the property when it made the copy.
    return stored.properties.get(ORIGIN_TOPIC)


def _trace_context(fields: dict[str, object]) -> dict[str, str]:
    """The consumer's `retry` span context from the request ({} when untraced)."""
    parent = fields.get("traceparent")
    if parent is None:
        return {}
    if type(parent) is not str or not _TRACEPARENT.fullmatch(parent):
        raise MalformedRequestError(f"field 'traceparent' must be a W3C traceparent, "
                                    f"not {parent!r}")
    context = {TRACEPARENT: parent}
    state = str_field(fields, "tracestate", MAX_TRACESTATE_CHARS, "")
    if state:
        context[TRACESTATE] = state
    return context


async def handle_send_back(ctx: BrokerContext, conn: ConnInfo, req: Frame) -> Frame:
    ctx.roles.require_master()  # a slave takes no write (and creates no topic)
    f = req.fields
    group = group_field(f)
    topic = topic_field(f)
    queue_id = queue_field(f)
    queue_offset = offset_field(f, "queue_offset")
    msg_id = parse_msg_id(f.get("msg_id"))
    reconsume = int_field(f, "reconsume_times", 0, MAX_RECONSUME_TIMES)
    max_reconsume = int_field(f, "max_reconsume_times", 0, MAX_RECONSUME_TIMES)
    delay_ms = int_field(f, "delay_ms", 0, 2**62, 0)
    if delay_ms > ctx.config.max_delay_ms:
        raise InvalidDelayError(f"a back-off of {delay_ms} ms exceeds this broker's maximum "
                                f"delay of {ctx.config.max_delay_ms} ms")
    if req.body:
        raise MalformedRequestError("SEND_BACK carries no message: the broker sends back the "
                                    "one it stores at the named queue offset")
    trace_context = _trace_context(f)
    _check_topic(topic, group)
    stored = stored_at(ctx.store, topic, queue_id, queue_offset, msg_id)
    origin = _origin(topic, stored)
    props = decode_properties(stored.properties_raw)
    for name in _ROUTING_PROPERTIES:
        props.pop(name, None)
    props.pop(ORIGIN_TOPIC, None)
    if origin:
        props[ORIGIN_TOPIC] = origin
    props.update(trace_context)
    if reconsume > max_reconsume:
        target, target_queue, flags = dlq_topic(group), 0, 0
    elif delay_ms == 0:
        target, target_queue, flags = retry_topic(group), 0, 0
    else:
        props[DELIVER_AT_MS] = str(int(time.time() * 1000) + delay_ms)
        props[REAL_TOPIC] = retry_topic(group)
        props[REAL_QUEUE_ID] = "0"
        target, flags = SCHEDULE_TOPIC, int(MessageFlag.DELAY)
        target_queue = sum(group.encode()) % ctx.topics.queues_for_send(SCHEDULE_TOPIC)
        # The retry topic is registered now, not when the back-off ends: its route is out
        # by then, so the group's consumers serve its queue before the copy arrives.
        ctx.topics.queues_for_send(retry_topic(group), req)
    ctx.topics.queues_for_send(target, req)  # registers the internal topic on first use
    if trace_context:
        flags |= _TRACED  # the copy carries the trace on, even untraced here
    copy = MessageIn(target, target_queue, bytes(stored.body), stored.tags, stored.keys,
                     encode_properties(props), msg_id, flags, stored.born_ts_ms, conn.peer,
                     reconsume)
    if flags & _TRACED and tracing().enabled:
        offset = await _store_traced(ctx, copy, props, group, origin or topic, delay_ms,
                                     reconsume > max_reconsume)
        return response(req, {"target": target, "queue_offset": offset})
    results = await ctx.pipeline.store_prepared([copy])
    return response(req, {"target": target, "queue_offset": results[0].queue_offset})


async def _store_traced(ctx: BrokerContext, copy: MessageIn, props: dict[str, str], group: str,
                        origin: str, delay_ms: int, dead: bool) -> int:
    """Store the copy of a traced message under a `retry` / `dlq` span; its queue offset."""
    with hop_span("dlq" if dead else "retry", destination=copy.topic, kind=SpanKind.SERVER,
                  msg_id=msg_id_hex(copy.msg_id), parent=extract(props),
                  attributes={"messaging.consumer.group.name": group,
                              "ferry.broker": ctx.config.name, "ferry.origin_topic": origin,
                              "ferry.reconsume_times": copy.reconsume_times,
                              "ferry.delay_ms": delay_ms,
                              "ferry.outcome": "dead_letter" if dead else "retry"}):
        # The copy keeps the context it came with (the consumer's `retry` span): the
        # redelivery hangs below the consumer's settle, this span beside it.
        results = await ctx.pipeline.store_prepared([copy])
    return results[0].queue_offset
