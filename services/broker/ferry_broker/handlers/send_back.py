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
)
from ferry.errors import InvalidDelayError, MalformedRequestError
from ferry.names import SCHEDULE_TOPIC, dlq_topic, is_internal, retry_topic
from ferry.store import MessageIn, decode_properties, encode_properties
from ferry.wire import Frame, response

from ferry_broker.context import BrokerContext, ConnInfo
from ferry_broker.handlers.fields import group_field, int_field, topic_field
from ferry_broker.handlers.send import decode_batch
from ferry_broker.roles import require_master

MAX_RECONSUME_TIMES = 10_000
# The copy's own routing is decided here: stale ones from an earlier trip are dropped.
_ROUTING_PROPERTIES = (DELIVER_AT_MS, REAL_TOPIC, REAL_QUEUE_ID, RECONSUME_TIMES)
_DELAY = int(MessageFlag.DELAY)
_TRACED = int(MessageFlag.TRACED)   # the only entry flag the copy keeps: its trace goes on


async def handle_send_back(ctx: BrokerContext, conn: ConnInfo, req: Frame) -> Frame:
    require_master(ctx)  # a slave takes no write (and creates no topic)
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
    copy = MessageIn(target, queue_id, msg.body, msg.tags, msg.keys, encode_properties(props),
                     msg.msg_id, flags | (msg.flags & _TRACED), msg.born_ts_ms, conn.peer,
                     reconsume)
    results = await ctx.pipeline.store_prepared([copy])
    return response(req, {"target": target, "queue_offset": results[0].queue_offset})
