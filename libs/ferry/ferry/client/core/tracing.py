"""The clients' spans: a producer's `send`, a transaction's `half` and `end`, a
consumer's `receive`, `process`, `retry` and `dlq` (docs/tracing.md).

Everything here runs only for a traced message: the callers decide with one
check (`Tracing.sample()` / the `trace=` argument at send, the record's
`MessageFlag.TRACED` bit at receive), so an untraced message costs no span and
no property parsing.
"""
from __future__ import annotations

import asyncio
import dataclasses
import math
import random
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from ferry.client.core.batch_hook import batch_hook, offer_batch_hook
from ferry.client.core.message import ConsumerRecord, Message, SendResult
from ferry.codec.message_flags import MessageFlag
from ferry.codec.record import H_FLAGS
from ferry.names import DLQ_PREFIX, dlq_topic, retry_topic
from ferry.telemetry import Tracing, extract, hop_span, inject, links_of, start_hop
from ferry.telemetry.spans import (
    BATCH_COUNT,
    BATCH_MESSAGE_OPERATION,
    BODY_SIZE,
    BROKER,
    CONSUMER_GROUP,
    MESSAGE_ID,
    OK,
    OUTCOME,
    PARTITION,
    QUEUE_OFFSET,
    RECONSUME_TIMES,
)

TRACED = int(MessageFlag.TRACED)
_HEADER = 8   # ConsumerRecord's stored-header slot (see message.py)
#: A gap that never runs out: nothing is sampled (tracing off, or a ratio of 0).
NEVER = 1 << 62


def wants_trace(tr: Tracing, trace_arg: bool | None) -> bool:
    """The producer's decision for one message: forced, refused, or sampled."""
    return tr.sample() if trace_arg is None else bool(trace_arg) and tr.enabled


def sample_gap(tr: Tracing) -> int:
    """How many unforced messages to send untraced before the next traced one.

    Drawn from the geometric law of `tr.sample_ratio` p (P(gap >= k) = (1-p)^k):
    a sequence of such gaps marks messages exactly as one `tr.sample()` per
    message would, at one random draw per traced message instead of one per
    message (the producer's hot path only counts down).
    """
    ratio = tr.sample_ratio
    if not tr.enabled or ratio <= 0.0:
        return NEVER
    if ratio >= 1.0:
        return 0
    return int(math.log(1.0 - random.random()) / math.log(1.0 - ratio))  # noqa: S311


class Sampler:
    """A producer's sampling: which unforced (trace=None) messages are traced.

    `left` counts the unforced messages still to send untraced before the next
    traced one (-1: not drawn yet); `sample_gap` draws each count. `send`'s hot
    path counts `left` down itself and calls `next()` only when it runs out.
    """

    __slots__ = ("tracing", "left")

    def __init__(self, tr: Tracing) -> None:
        self.tracing = tr
        self.left = -1

    def use(self, tr: Tracing) -> None:
        """Sample for `tr` from now on (its ratio is drawn from at the next message)."""
        self.tracing = tr
        self.left = -1

    def next(self) -> bool:
        """Whether the next unforced message is traced."""
        return bool(self.picks(1))

    def picks(self, n: int) -> list[int]:
        """Which of the next `n` unforced messages are traced, by position."""
        picks: list[int] = []
        i = 0
        left = self.left
        tr = self.tracing
        while True:
            if left < 0:
                left = sample_gap(tr)
            if i + left >= n:
                self.left = left - (n - i)
                return picks
            i += left
            if tr.enabled:
                picks.append(i)
            i += 1
            left = sample_gap(tr)


def start_send(topic: str, body_size: int, hop: str = "send", batch_count: int | None = None,
               kind: SpanKind | None = None, operation: str | None = None) -> Span:
    """The span of one message's send (ended by `end_on_result` or `end_with`)."""
    return start_hop(hop, destination=topic, kind=kind, operation=operation,
                     attributes={BODY_SIZE: body_size, BATCH_COUNT: batch_count})


def carry(span: Span, properties: Mapping[str, str] | None) -> dict[str, str]:
    """`properties` plus the span's context (TRACEPARENT, TRACESTATE)."""
    props = dict(properties) if properties else {}
    inject(props, trace.set_span_in_context(span))
    return props


def end_with(span: Span, result: SendResult | None = None,
             error: BaseException | None = None) -> None:
    """Record where the message was stored (or why not) and end the span."""
    if error is not None:
        span.record_exception(error)
        span.set_status(Status(StatusCode.ERROR, str(error) or type(error).__name__))
        span.set_attribute(OUTCOME, "failed")
    elif result is not None:
        span.set_attributes({MESSAGE_ID: result.msg_id, BROKER: result.broker,
                             PARTITION: str(result.queue_id), QUEUE_OFFSET: result.queue_offset,
                             OUTCOME: OK})
    span.end()


def end_on_result(span: Span, fut: asyncio.Future[Any]) -> None:
    """End the send span when the broker answers the message's future."""
    def done(f: asyncio.Future[Any]) -> None:
        if f.cancelled():
            end_with(span, error=asyncio.CancelledError("the send was cancelled"))
        elif f.exception() is not None:
            end_with(span, error=f.exception())
        else:
            end_with(span, f.result())
    fut.add_done_callback(done)


class BatchTrace:
    """The spans of a traced `send_batch`: one per traced message, and one for the batch
    that links to them (each message starts its own trace; the batch span says they
    travelled together)."""

    def __init__(self, topic: str, messages: Sequence[Message], decisions: Sequence[bool]
                 ) -> None:
        self.topic = topic
        self.count = len(messages)
        self.spans: dict[int, Span] = {}
        out = []
        for i, (msg, traced) in enumerate(zip(messages, decisions, strict=True)):
            if traced:
                # "create": the message is made here and sent by the batch's span
                span = start_send(topic, len(msg.body), batch_count=self.count,
                                  operation=BATCH_MESSAGE_OPERATION)
                self.spans[i] = span
                msg = dataclasses.replace(msg, properties=carry(span, msg.properties))
            out.append(msg)
        self.messages = out
        self.batch = start_hop("send", destination=topic,
                               links=links_of([trace.set_span_in_context(s)
                                               for s in self.spans.values()]),
                               attributes={BATCH_COUNT: self.count})

    def finish(self, results: Sequence[SendResult] | None,
               error: BaseException | None = None) -> None:
        for i, span in self.spans.items():
            end_with(span, results[i] if results is not None else None, error)
        if results:
            first = results[0]
            self.batch.set_attributes({BROKER: first.broker, PARTITION: str(first.queue_id)})
        end_with(self.batch, None, error)


def batch_trace(tr: Tracing, topic: str, messages: Sequence[Message],
                sampled: Callable[[int], list[int]]) -> BatchTrace | None:
    """The batch's trace, or None when no message of it is traced (the common case).

    `sampled(n)`: which of the next n unforced messages the sampling traces, by
    position among them (the producer's countdown, see `sample_gap`).
    """
    if not tr.enabled:
        return None
    forced = [m.trace for m in messages]
    unforced = forced.count(None)
    picks = sampled(unforced) if unforced else []
    if unforced == len(forced):
        if not picks:
            return None
        decisions = [False] * len(forced)
        for i in picks:
            decisions[i] = True
    else:
        picked = set(picks)
        decisions = []
        k = 0
        for f in forced:
            if f is None:
                decisions.append(k in picked)
                k += 1
            else:
                decisions.append(bool(f))
        if not any(decisions):
            return None
    return BatchTrace(topic, messages, decisions)


# -- consumer side ------------------------------------------------------------------------

def record_context(record: ConsumerRecord) -> Context | None:
    """The trace context a record carries, or None (one bit test for an untraced one)."""
    if not record[_HEADER][H_FLAGS] & TRACED:
        return None
    return extract(record.properties)


def consumer_attributes(record: ConsumerRecord, group: str) -> dict[str, Any]:
    return {BODY_SIZE: len(record.body), CONSUMER_GROUP: group, BROKER: record.broker,
            PARTITION: str(record.queue_id), QUEUE_OFFSET: record.queue_offset,
            RECONSUME_TIMES: record.reconsume_times}


def receive_span(record: ConsumerRecord, group: str, ctx: Context) -> None:
    """A finished `receive` span for a traced record handed to the application."""
    start_hop("receive", destination=record.topic, msg_id=record.msg_id, parent=ctx,
              attributes=consumer_attributes(record, group)).end()



def trace_received(tr: Tracing, batch: Mapping[Any, list[ConsumerRecord]], group: str) -> None:
    """A `receive` span for each traced record of a batch handed to the application."""
    if not tr.enabled:
        return
    for records in batch.values():
        for record in records:
            if record[_HEADER][H_FLAGS] & TRACED:
                ctx = extract(record.properties)
                if ctx is not None:
                    receive_span(record, group, ctx)


def traced_handler(handler: Callable[[ConsumerRecord], Awaitable[Any]], group: str
                   ) -> Callable[[ConsumerRecord], Awaitable[Any]]:
    """`handler` with a `process` span (and its outcome) around each traced record."""
    async def process(record: ConsumerRecord) -> Any:
        if not record[_HEADER][H_FLAGS] & TRACED:
            return await handler(record)
        ctx = extract(record.properties)
        if ctx is None:
            return await handler(record)
        with hop_span("process", destination=record.topic, msg_id=record.msg_id, parent=ctx,
                      attributes=consumer_attributes(record, group)) as span:
            result = await handler(record)
            span.set_attribute(OUTCOME, OK)
            return result
    offer_batch_hook(process, batch_hook(handler))   # an idempotence check's prefetch
    return process


def start_settle(record: ConsumerRecord, group: str, reconsume_times: int,
                 max_reconsume_times: int) -> Span | None:
    """The `retry` (or, past the limit, `dlq`) span of a traced record's send-back, or None."""
    ctx = record_context(record)
    if ctx is None:
        return None
    dead = reconsume_times > max_reconsume_times
    attrs = consumer_attributes(record, group)
    attrs[RECONSUME_TIMES] = reconsume_times
    return start_hop("dlq" if dead else "retry", msg_id=record.msg_id, parent=ctx,
                     destination=dlq_topic(group) if dead else retry_topic(group),
                     attributes=attrs)


def end_settle(span: Span, answer: Mapping[str, Any] | None,
               error: BaseException | None = None) -> None:
    """End a send-back span with where the broker stored the copy (or why not)."""
    if error is not None:
        end_with(span, error=error)
        return
    assert answer is not None
    dead = str(answer.get("target", "")).startswith(DLQ_PREFIX)
    span.set_attributes({"ferry.target": str(answer.get("target")),
                         QUEUE_OFFSET: answer.get("queue_offset"),
                         OUTCOME: "dead_letter" if dead else "retry"})
    span.end()
