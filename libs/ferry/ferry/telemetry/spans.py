"""The one way every hop makes its span, so all of Ferry's spans have the same shape.

`hop_span(hop, destination=..., msg_id=..., parent=...)` opens a span named
`"{hop} {destination}"` (the OpenTelemetry messaging convention's
`"{operation name} {destination}"`, with the hop as the operation name) of the
hop's kind, with the messaging attributes every span has. The hop table below
is the contract: which `messaging.operation.type` and span kind each hop has
(docs/tracing.md lists it with each hop's attributes).

A hop only calls this for a traced message; with tracing off `hop_span`
costs one attribute check and yields OpenTelemetry's shared non-recording span.
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Link, Span, SpanKind

# -- attribute names (OpenTelemetry messaging semantic conventions, plus ferry.*) ------
SYSTEM = "messaging.system"
OPERATION_TYPE = "messaging.operation.type"
OPERATION_NAME = "messaging.operation.name"
DESTINATION = "messaging.destination.name"
MESSAGE_ID = "messaging.message.id"
BODY_SIZE = "messaging.message.body.size"
CONSUMER_GROUP = "messaging.consumer.group.name"
BATCH_COUNT = "messaging.batch.message_count"
PARTITION = "messaging.destination.partition.id"
HOP = "ferry.hop"
BROKER = "ferry.broker"
QUEUE_OFFSET = "ferry.queue_offset"
OUTCOME = "ferry.outcome"
RECONSUME_TIMES = "ferry.reconsume_times"
SERVICE = "ferry.service"

SYSTEM_NAME = "ferry"

#: hop -> (messaging.operation.type, default span kind). `half` and `end` are
#: PRODUCER / CLIENT at the producer and SERVER at the broker (pass `kind=`).
HOPS: dict[str, tuple[str, SpanKind]] = {
    "send": ("send", SpanKind.PRODUCER),
    "store": ("send", SpanKind.SERVER),
    "schedule": ("create", SpanKind.INTERNAL),
    "deliver": ("send", SpanKind.PRODUCER),
    "half": ("send", SpanKind.PRODUCER),
    "end": ("settle", SpanKind.CLIENT),
    "check": ("process", SpanKind.CLIENT),
    "receive": ("receive", SpanKind.CONSUMER),
    "process": ("process", SpanKind.CONSUMER),
    "retry": ("settle", SpanKind.PRODUCER),
    "dlq": ("settle", SpanKind.PRODUCER),
    "bridge": ("send", SpanKind.PRODUCER),
    "task": ("process", SpanKind.CONSUMER),
    "dedup": ("process", SpanKind.INTERNAL),
}

#: The operation of each message's own span in a `send_batch` (the hop stays `send`; the
#: batch's span, which sends them, is the `send` operation): OpenTelemetry's messaging
#: conventions call the span that creates a message sent later in a batch "create".
BATCH_MESSAGE_OPERATION = "create"

#: Outcomes hops record in `ferry.outcome`.
OK, FAILED, DUPLICATE, DEAD_LETTER = "ok", "failed", "duplicate", "dead_letter"


def links_of(contexts: Sequence[Context | None]) -> list[Link]:
    """Span links to each valid span context among `contexts` (a batch's messages)."""
    out = []
    for ctx in contexts:
        if ctx is None:
            continue
        sc = trace.get_current_span(ctx).get_span_context()
        if sc.is_valid:
            out.append(Link(sc))
    return out


def _attributes(hop: str, operation: str | None, destination: str, msg_id: str | None,
                service: str, attributes: Mapping[str, Any] | None) -> dict[str, Any]:
    attrs: dict[str, Any] = {SYSTEM: SYSTEM_NAME, OPERATION_TYPE: operation or HOPS[hop][0],
                             OPERATION_NAME: operation or hop, DESTINATION: destination,
                             HOP: hop, SERVICE: service}
    if msg_id is not None:
        attrs[MESSAGE_ID] = msg_id
    if attributes:
        attrs.update((k, v) for k, v in attributes.items() if v is not None)
    return attrs


def start_hop(hop: str, *, destination: str, msg_id: str | None = None,
              parent: Context | None = None, kind: SpanKind | None = None,
              links: Sequence[Link] = (), attributes: Mapping[str, Any] | None = None,
              operation: str | None = None) -> Span:
    """A started hop span that the caller ends (`span.end()`), not made current.

    For a hop that finishes later, in a callback: a producer's send span ends
    when the broker acknowledges. Same attributes and kinds as `hop_span`.
    `operation` overrides the hop's operation (type, name and the span name's
    first word): a batch's per-message spans are `create` (BATCH_MESSAGE_OPERATION).
    """
    from ferry.telemetry.setup import tracing

    tr = tracing()
    if not tr.enabled:
        return trace.INVALID_SPAN
    return tr.tracer.start_span(f"{operation or hop} {destination}", context=parent,
                                kind=kind or HOPS[hop][1], links=list(links),
                                attributes=_attributes(hop, operation, destination, msg_id,
                                                       tr.service, attributes))


@contextmanager
def hop_span(hop: str, *, destination: str, msg_id: str | None = None,
             parent: Context | None = None, kind: SpanKind | None = None,
             links: Sequence[Link] = (),
             attributes: Mapping[str, Any] | None = None) -> Iterator[Span]:
    """A span for one hop of a message, current inside the block.

    `parent` is the message's context (from `extract`, or the send span's);
    None means the current context (a send inside the caller's own span
    becomes its child). An exception leaving the block marks the span ERROR
    with `ferry.outcome` "failed" unless the block set an outcome itself.
    Attributes whose value is None are left out.
    """
    from ferry.telemetry.setup import tracing  # setup imports the exporters, which import this

    tr = tracing()
    if not tr.enabled:
        yield trace.INVALID_SPAN
        return
    with tr.tracer.start_as_current_span(
            f"{hop} {destination}", context=parent, kind=kind or HOPS[hop][1],
            links=list(links),
            attributes=_attributes(hop, None, destination, msg_id, tr.service, attributes),
            record_exception=True, set_status_on_exception=True, end_on_exit=True) as span:
        try:
            yield span
        except BaseException:
            if span.is_recording() and OUTCOME not in (getattr(span, "attributes", None) or {}):
                span.set_attribute(OUTCOME, FAILED)
            raise
