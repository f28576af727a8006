"""SEND: store a batch of messages in one queue with one write, then acknowledge.

The batch is stored by one `put_batch` call (one commit-log write). In sync
flush mode the answer waits until the store has fsynced the batch's last
byte; after `flush_timeout_ms` it fails with FlushTimeoutError (the messages
are stored, only their durability is unconfirmed). Long polls parked on the
queue are woken right after the write.
"""
from __future__ import annotations

from ferry.errors import FlushTimeoutError, MalformedRequestError, StoreError
from ferry.store import MessageIn, PutStatus
from ferry.wire import Frame, decode_messages, response

from ferry_broker.context import BrokerContext, ConnInfo
from ferry_broker.handlers.fields import queue_field, topic_field

MAX_BATCH_MESSAGES = 10_000


async def handle_send(ctx: BrokerContext, conn: ConnInfo, req: Frame) -> Frame:
    topic = topic_field(req.fields)
    queue_id = queue_field(req.fields)
    queues = ctx.topics.queues_for_send(topic)
    if queue_id >= queues:
        raise MalformedRequestError(f"queue_id {queue_id} is out of range: {topic} has {queues}")
    msgs = decode_messages(req.body)
    if not msgs:
        raise MalformedRequestError("SEND carries no messages")
    if len(msgs) > MAX_BATCH_MESSAGES:
        raise MalformedRequestError(f"SEND carries {len(msgs)} messages; the limit is "
                                    f"{MAX_BATCH_MESSAGES}")
    batch = [
        MessageIn(topic=topic, queue_id=queue_id, body=m.body, tags=m.tags, keys=m.keys,
                  properties=m.properties, msg_id=m.msg_id, flags=m.flags,
                  born_ts_ms=m.born_ts_ms, born_host=conn.peer)
        for m in msgs
    ]
    results = ctx.store.put_batch(batch)
    ctx.long_poll.notify(topic, queue_id)
    bad = next((r for r in results if r.status is not PutStatus.OK), None)
    if bad is not None:
        raise StoreError(f"store refused the batch: {bad.status.name}")
    if ctx.config.flush_mode == "sync":
        try:
            await ctx.durability.wait(ctx.store.wait_durable(results[-1].end_offset))
        except FlushTimeoutError:
            raise FlushTimeoutError(
                f"stored but not flushed within {ctx.config.flush_timeout_ms} ms"
            ) from None
    first = results[0]
    return response(req, {"queue_id": queue_id, "queue_offset": first.queue_offset,
                          "count": len(results), "phy_offset": first.phy_offset})
