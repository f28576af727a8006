"""The scheduler's spans: `schedule` when it takes a traced message in, `deliver` when due.

Only messages whose flags carry `MessageFlag.TRACED` are looked at (one bit
test per message; nothing else on the untraced path). The trace continues in
the message's own properties:

- `schedule` (INTERNAL, operation `create`) is a child of the context the
  `%SCHEDULE%` record carries (the producer's send, or the broker's retry
  span); it spans the local append, its fsync and the wheel insertion, and
  its context replaces `TRACEPARENT` in the local copy;
- `deliver` (PRODUCER, operation `send`) is a child of that `schedule`
  context and spans the DELIVER_DUE request; the delivered message carries
  the deliver span's context on, so the consumer's spans hang below it.
"""
from __future__ import annotations

from collections.abc import Sequence
from contextlib import ExitStack

from ferry.codec import DELIVER_AT_MS, REAL_TOPIC, MessageFlag, StoredMessage, msg_id_hex
from ferry.codec.properties import decode_properties, encode_properties
from ferry.telemetry import extract, hop_span, inject, tracing
from ferry.wire import WireMessage
from opentelemetry.context import Context
from opentelemetry.trace import set_span_in_context

TRACED = int(MessageFlag.TRACED)
SCHEDULER = "ferry.scheduler"
BROKER = "ferry.broker"
DELIVER_AT = "ferry.deliver_at_ms"


def schedule_spans(stack: ExitStack, records: Sequence[StoredMessage], broker: str,
                   node_id: str) -> dict[int, Context]:
    """Open a `schedule` span (closed with `stack`) for each traced record taken from
    `broker`; the context of each, by the record's index in `records`."""
    out: dict[int, Context] = {}
    if not tracing().enabled:
        return out
    for i, rec in enumerate(records):
        if not rec.flags & TRACED:
            continue
        props = rec.properties
        raw_at = props.get(DELIVER_AT_MS)
        span = stack.enter_context(hop_span(
            "schedule", destination=props.get(REAL_TOPIC, ""), msg_id=msg_id_hex(rec.msg_id),
            parent=extract(props),
            attributes={BROKER: broker, SCHEDULER: node_id,
                        DELIVER_AT: int(raw_at) if raw_at and raw_at.isdigit() else None,
                        "ferry.reconsume_times": rec.reconsume_times}))
        out[i] = set_span_in_context(span)
    return out


def deliver_spans(stack: ExitStack, msgs: list[WireMessage], topic: str, queue_id: int,
                  broker: str, node_id: str) -> None:
    """Open a `deliver` span (closed with `stack`) for each traced message about to be
    re-sent; each message then carries its deliver span's context (replaced in place)."""
    if not tracing().enabled:
        return
    for i, msg in enumerate(msgs):
        if not msg.flags & TRACED:
            continue
        props = decode_properties(msg.properties)
        span = stack.enter_context(hop_span(
            "deliver", destination=topic, msg_id=msg_id_hex(msg.msg_id), parent=extract(props),
            attributes={BROKER: broker, SCHEDULER: node_id,
                        "messaging.destination.partition.id": str(queue_id) if queue_id >= 0
                        else None}))
        if span.get_span_context().is_valid:
            inject(props, set_span_in_context(span))
            msgs[i] = WireMessage(msg.body, msg.msg_id, msg.born_ts_ms, msg.flags, msg.tags,
                                  msg.keys, encode_properties(props))
