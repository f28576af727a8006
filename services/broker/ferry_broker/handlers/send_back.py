"""SEND_BACK: a consumer's nack. A copy of the message returns to the group later.

The copy keeps the message id and gains `ORIGIN_TOPIC` (the topic the group
first received it from). Where it goes:
- `reconsume_times` beyond `max_reconsume_times`: `%DLQ%<group>`, for good;
- `delay_ms` 0: `%RETRY%<group>` at once (the group's consumers subscribe to it);
- otherwise `%SCHEDULE%`, bound for `%RETRY%<group>` once the back-off has
  passed (the delay scheduler delivers it, like any delayed message).
Any broker accepts a SEND_BACK (the body is the whole message), so a consumer
whose message's broker died sends it back elsewhere. The answer comes once the
copy is stored (and flushed, on a sync-flush broker): only then may the
consumer commit past the original.

A TRACED message gets a `retry` (or `dlq`) span at the broker (SERVER kind),
child of the context it carries (the consumer's own `retry` span); the copy
keeps that context and the TRACED flag, so the scheduler's and the next
consumer's spans hang below the consumer's `retry`.
"""
from __future__ import annotations

import time

from ferry.codec import (
    DELIVER_AT_MS,
    ORIGIN_TOPIC,
    REAL_QUEUE_ID,
    REAL_TOPIC,
    RECONSUME_TIMES,
    MessageFlag,
    msg_id_hex,
)
from ferry.errors import InvalidDelayError, MalformedRequestError
from ferry.names import SCHEDULE_TOPIC, dlq_topic, is_internal, retry_topic
from ferry.store import MessageIn, decode_properties, encode_properties
from ferry.telemetry import extract, hop_span, tracing
from ferry.wire import Frame, response
from opentelemetry.trace import SpanKind

from ferry_broker.context import BrokerContext, ConnInfo
from ferry_broker.handlers.fields import group_field, int_field, topic_field
from ferry_broker.handlers.send import decode_batch

MAX_RECONSUME_TIMES = 10_000
# The copy's own routing is decided here: stale ones from an earlier trip are dropped.
_ROUTING_PROPERTIES = (DELIVER_AT_MS, REAL_TOPIC, REAL_QUEUE_ID, RECONSUME_TIMES)
_DELAY = int(MessageFlag.DELAY)
_TRACED = int(MessageFlag.TRACED)   # the only entry flag the copy keeps: its trace goes on


async def handle_send_back(ctx: BrokerContext, conn: ConnInfo, req: Frame) -> Frame:
    ctx.roles.require_master()  # a slave takes no write (and creates no topic)
    f = req.fields
    group = group_field(f)
    topic = topic_field(f)
    reconsume = int_field(f, "reconsume_times", 0, MAX_RECONSUME_TIMES)
    max_reconsume = int_field(f, "max_reconsume_times", 0, MAX_RECONSUME_TIMES)
    delay_ms = int_field(f, "delay_ms", 0, 2**62, 0)
    if delay_ms > ctx.config.max_delay_ms:
        raise InvalidDelayError(f"a back-off of {delay_ms} ms exceeds this broker's maximum "
                                f"delay of {ctx.config.max_delay_ms} ms")
    msgs = decode_batch(ctx, conn, topic, 0, req.body)
    if len(msgs) != 1:
        raise MalformedRequestError(f"SEND_BACK carries one message, not {len(msgs)}")
    msg = msgs[0]
    if not msg.msg_id:
        raise MalformedRequestError("SEND_BACK needs the message's id")
    props = decode_properties(msg.properties)
    for name in _ROUTING_PROPERTIES:
        props.pop(name, None)
    if ORIGIN_TOPIC not in props and not is_internal(topic):
        props[ORIGIN_TOPIC] = topic
    if reconsume > max_reconsume:
        target, queue_id, flags = dlq_topic(group), 0, 0
    elif delay_ms == 0:
        target, queue_id, flags = retry_topic(group), 0, 0
    else:
        props[DELIVER_AT_MS] = str(int(time.time() * 1000) + delay_ms)
        props[REAL_TOPIC] = retry_topic(group)
        props[REAL_QUEUE_ID] = "0"
        target, flags = SCHEDULE_TOPIC, _DELAY
        queue_id = sum(group.encode()) % ctx.topics.queues_for_send(SCHEDULE_TOPIC)
    ctx.topics.queues_for_send(target)  # registers the internal topic on first use
    flags |= msg.flags & _TRACED  # the copy carries the trace on, even untraced here
    if flags & _TRACED and tracing().enabled:
        offset = await _store_traced(ctx, msg._replace(topic=target, queue_id=queue_id,
                                                       flags=flags, born_host=conn.peer,
                                                       reconsume_times=reconsume),
                                     props, group, topic, delay_ms, reconsume > max_reconsume)
        return response(req, {"target": target, "queue_offset": offset})
    copy = MessageIn(target, queue_id, msg.body, msg.tags, msg.keys, encode_properties(props),
                     msg.msg_id, flags, msg.born_ts_ms, conn.peer, reconsume)
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
        results = await ctx.pipeline.store_prepared(
            [copy._replace(properties=encode_properties(props))])
    return results[0].queue_offset
