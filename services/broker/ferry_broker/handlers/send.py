"""SEND: store a batch of messages in one queue with one write, then acknowledge.

The SEND body goes to the store as it came (`put_encoded_batch`: the store
validates and encodes each entry straight from the wire bytes, one commit-log
write, no object per message). In sync flush mode the answer waits until the
store has fsynced the batch's last byte; after `flush_timeout_ms` it fails with FlushTimeoutError (the messages
are stored, only their durability is unconfirmed). Long polls parked on the
queue are woken right after the write. A store that refuses the write (failed or
closed) is answered with StoreUnavailableError, retriable (see `health.py`).
"""
from __future__ import annotations

from ferry.errors import FlushTimeoutError, MalformedRequestError, StoreError
from ferry.store import PutStatus
from ferry.wire import Frame, response

from ferry_broker.context import BrokerContext, ConnInfo
from ferry_broker.handlers.fields import queue_field, topic_field

MAX_BATCH_MESSAGES = 10_000


async def handle_send(ctx: BrokerContext, conn: ConnInfo, req: Frame) -> Frame:
    topic = topic_field(req.fields)
    queue_id = queue_field(req.fields)
    queues = ctx.topics.queues_for_send(topic)
    if queue_id >= queues:
        raise MalformedRequestError(f"queue_id {queue_id} is out of range: {topic} has {queues}")
    if not req.body:
        raise MalformedRequestError("SEND carries no messages")
    if ctx.health.stalled is not None:  # acknowledging now would promise nothing
        raise ctx.health.unavailable(StoreError(ctx.health.stalled), sticky=False)
    try:
        res = ctx.store.put_encoded_batch(topic, queue_id, req.body, born_host=conn.peer,
                                          max_messages=MAX_BATCH_MESSAGES)
    except (StoreError, OSError) as exc:
        # A failed or closed store: retriable, so the producer sends elsewhere.
        raise ctx.health.unavailable(exc) from None
    ctx.long_poll.notify(topic, queue_id)
    if res.status is not PutStatus.OK:
        raise ctx.health.unavailable(StoreError(f"store refused the batch: {res.status.name}"))
    if ctx.config.flush_mode == "sync":
        try:
            await ctx.durability.wait(ctx.store.wait_durable(res.end_offset))
        except FlushTimeoutError:
            raise FlushTimeoutError(
                f"stored but not flushed within {ctx.config.flush_timeout_ms} ms"
            ) from None
        except StoreError as exc:  # the flush thread failed: stored, never durable here
            raise ctx.health.unavailable(exc) from None
    return response(req, {"queue_id": queue_id, "queue_offset": res.first_queue_offset,
                          "count": res.message_count, "phy_offset": res.first_phy_offset})
