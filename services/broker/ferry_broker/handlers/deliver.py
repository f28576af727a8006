"""DELIVER_DUE: the delay scheduler re-sends due messages to their real topic.

The messages keep their ids; an entry's `RECONSUME_TIMES` property becomes its
stored `reconsume_times` (retries travel through `%SCHEDULE%` too). Unlike
SEND this may write `%RETRY%<group>` and `%DLQ%<group>`, never `%SCHEDULE%`,
`%HALF%` or `%OP%`, and an entry may not carry DELAY (a due message is not
delayed again). `queue_id` -1 lets the broker pick the queue (round robin).
The messages then pass the put pipeline like a flagged SEND (TTL applies from
now on).

`roll: true` (the scheduler rolling a long-pending message, docs/delay.md):
every entry must still carry DELAY and its DELIVER_AT_MS; the delay hook
stores it in `%SCHEDULE%` again (a new, replicated copy with the same id and
due time), or in its topic when it is due by now.
"""
from __future__ import annotations

import itertools

from ferry.codec import RECONSUME_TIMES, MessageFlag
from ferry.errors import InvalidNameError, MalformedRequestError
from ferry.names import is_dlq_topic, is_internal, is_retry_topic
from ferry.store import decode_properties
from ferry.wire import Frame, response

from ferry_broker.context import BrokerContext, ConnInfo
from ferry_broker.handlers.fields import MAX_QUEUE_ID, int_field, topic_field
from ferry_broker.handlers.send import checked_queue, decode_batch
from ferry_broker.put_pipeline import PutBatch

_DELAY = int(MessageFlag.DELAY)
_next_queue = itertools.count()


async def handle_deliver_due(ctx: BrokerContext, conn: ConnInfo, req: Frame) -> Frame:
    ctx.roles.require_master()  # a slave takes no write (and creates no topic)
    topic = topic_field(req.fields)
    if is_internal(topic) and not (is_retry_topic(topic) or is_dlq_topic(topic)):
        raise InvalidNameError(f"DELIVER_DUE cannot write {topic}")
    roll = req.fields.get("roll") is True
    queue_id = int_field(req.fields, "queue_id", -1, MAX_QUEUE_ID)
    if queue_id < 0:
        queue_id = next(_next_queue) % ctx.topics.queues_for_send(topic)
    checked_queue(ctx, topic, queue_id)
    msgs = decode_batch(ctx, conn, topic, queue_id, req.body)
    for i, msg in enumerate(msgs):
        if bool(msg.flags & _DELAY) != roll:
            raise MalformedRequestError(
                f"message {i} of a DELIVER_DUE with roll must carry DELAY" if roll else
                f"message {i} of a DELIVER_DUE still carries DELAY")
        if not msg.msg_id:
            raise MalformedRequestError(f"message {i} of a DELIVER_DUE has no id")
        if msg.properties and RECONSUME_TIMES.encode() in msg.properties:
            raw = decode_properties(msg.properties).get(RECONSUME_TIMES, "0")
            try:
                msgs[i] = msg._replace(reconsume_times=max(0, int(raw)))
            except ValueError:
                raise MalformedRequestError(f"{RECONSUME_TIMES} {raw!r} is not a number") from None
    batch = PutBatch(topic, queue_id, msgs)
    results = await ctx.pipeline.put_messages(batch)
    return response(req, {"queue_id": queue_id, "queue_offset": results[0].queue_offset,
                          "count": len(results), "phy_offset": results[0].phy_offset})
