"""SEND: store a batch of messages in one queue with one write, then acknowledge.

A batch whose `flags` field has no hooked bit (nil, 0, or only TRACED) takes
the fast path: the SEND body goes to the store as it came
(`put_encoded_batch`: the store validates and encodes each entry straight
from the wire bytes, one commit-log write, no object per message; the
tracing hook walks a TRACED batch's entry heads). A flagged batch is decoded
and passes the before-put hooks (a delayed message is redirected to
`%SCHEDULE%`); its answer lists each entry's queue offset, -1 for a
redirected one. Either way the after-put hooks
wake parked pulls and, in sync flush mode, wait for the fsync (after
`flush_timeout_ms`: FlushTimeoutError, the messages are stored, only their
durability is unconfirmed). A SEND to a typed topic (`fifo`, `delay`,
`transaction`) is decoded and each message checked against the type
(`topic_types.py`). A store that refuses the write (failed or closed)
is answered with StoreUnavailableError, retriable (see `health.py`).

Internal topics (`%...%`) are refused: only the broker's hooks and the
requests made for that purpose (SEND_BACK, DELIVER_DUE) write them. The one
exception is the trace-topic exporter's SEND to `%TRACE%` with the field
`trace_export` true (ferry.client.core.trace_topic): spans are ordinary messages
there, so the SEND path stores them; any other SEND to `%TRACE%` is refused.
The field is checked strictly, since it opens an internal topic: its value must
be exactly true, the topic `%TRACE%`, and the frame must announce no message
flag (a delayed, expiring or half span message would leave the trace topic
through a hook, and a TRACED one would be traced itself); the fast path then
refuses an entry with a hooked flag.
"""
from __future__ import annotations

from ferry.codec import HOOKED_FLAGS, MessageFlag
from ferry.errors import InvalidNameError, MalformedRequestError
from ferry.names import TRACE_TOPIC, is_internal
from ferry.store import MessageIn
from ferry.wire import Frame, decode_messages, response

from ferry_broker.context import BrokerContext, ConnInfo
from ferry_broker.handlers.fields import int_field, queue_field, topic_field
from ferry_broker.put_pipeline import PutBatch
from ferry_broker.topic_types import NORMAL, check_send

MAX_BATCH_MESSAGES = 10_000
_TRACED = int(MessageFlag.TRACED)


def checked_queue(ctx: BrokerContext, topic: str, queue_id: int,
                  request: Frame | None = None) -> None:
    queues = ctx.topics.queues_for_send(topic, request)
    if queue_id >= queues:
        raise MalformedRequestError(f"queue_id {queue_id} is out of range: {topic} has {queues}")


def checked_trace_export(value: object, topic: str) -> None:
    """Refuse a `trace_export` field that is not exactly true, or on a topic but %TRACE%."""
    if value is not True:
        raise MalformedRequestError(f"trace_export must be true, not {value!r}")
    if topic != TRACE_TOPIC:
        raise InvalidNameError(f"topic {topic} is internal or not the trace topic: "
                               f"trace_export writes {TRACE_TOPIC} only")


def decode_batch(ctx: BrokerContext, conn: ConnInfo, topic: str, queue_id: int,
                 body: bytes | memoryview) -> list[MessageIn]:
    """The entries of a message batch as store input (ids and flags as sent)."""
    wire = decode_messages(body, ctx.config.max_message_bytes)
    if not wire:
        raise MalformedRequestError("the message batch is empty")
    if len(wire) > MAX_BATCH_MESSAGES:
        raise MalformedRequestError(f"the batch has more than {MAX_BATCH_MESSAGES} messages")
    return [MessageIn(topic, queue_id, m.body, m.tags, m.keys, bytes(m.properties), m.msg_id,
                      m.flags, m.born_ts_ms, conn.peer) for m in wire]


async def handle_send(ctx: BrokerContext, conn: ConnInfo, req: Frame) -> Frame:
    ctx.roles.require_master()  # a slave takes no write (and creates no topic)
    topic = topic_field(req.fields)
    export = "trace_export" in req.fields
    if export:
        checked_trace_export(req.fields["trace_export"], topic)
    elif is_internal(topic):
        raise InvalidNameError(f"topic {topic} is internal: only the broker writes it")
    queue_id = queue_field(req.fields)
    flags = int_field(req.fields, "flags", 0, 0xFFFFFFFF, 0)
    if export and flags:
        raise MalformedRequestError(f"a trace export announces no message flags, not {flags}")
    checked_queue(ctx, topic, queue_id, req)
    if not req.body:
        raise MalformedRequestError("SEND carries no messages")
    topic_type = ctx.topics.type_of(topic)
    if not flags & HOOKED_FLAGS and topic_type == NORMAL:
        # TRACED alone keeps the fast path (the tracing hook reads it)
        res = await ctx.pipeline.put_encoded(topic, queue_id, req.body, conn.peer,
                                             MAX_BATCH_MESSAGES, traced=bool(flags & _TRACED))
        return response(req, {"queue_id": queue_id, "queue_offset": res.first_queue_offset,
                              "count": res.message_count, "phy_offset": res.first_phy_offset})
    batch = PutBatch(topic, queue_id, decode_batch(ctx, conn, topic, queue_id, req.body))
    if not flags & HOOKED_FLAGS:  # a typed topic's plain SEND: refused as the fast path would
        unannounced = next((m.flags & HOOKED_FLAGS for m in batch.messages
                            if m.flags & HOOKED_FLAGS), 0)
        if unannounced:
            raise MalformedRequestError(f"a message carries flag(s) {unannounced} that the "
                                        f"SEND does not announce")
    check_send(topic, topic_type, batch.messages)  # a typed topic takes one kind (topic_types)
    results = await ctx.pipeline.put_messages(batch)
    offsets = [r.queue_offset if m.topic == topic and m.queue_id == queue_id else -1
               for m, r in zip(batch.messages, results, strict=True)]
    first = next((o for o in offsets if o >= 0), -1)
    return response(req, {"queue_id": queue_id, "queue_offset": first, "count": len(results),
                          "phy_offset": results[0].phy_offset, "offsets": offsets})
