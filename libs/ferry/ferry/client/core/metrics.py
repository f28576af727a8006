"""The clients' metrics through the OpenTelemetry API, named by its messaging conventions.

- `messaging.client.sent.messages` (counter): messages a producer had acknowledged
  (or that failed: with `error.type`), per topic;
- `messaging.client.consumed.messages` (counter): records a consumer handed to the
  application, per topic and group;
- `messaging.client.operation.duration` (histogram, s): one SEND request, ack included.

Only the API: with no MeterProvider set by the application (`opentelemetry.metrics.
set_meter_provider`, e.g. with the Prometheus or OTLP reader) every instrument is a
no-op, and the hooks skip it before building its attributes (`_live`: `async for`
calls the consume hook once per record). Counted per batch, not per message;
attribute sets are kept per topic.
docs/metrics.md lists them.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from opentelemetry import metrics

from ferry.client.core.tracing import trace_received
from ferry.telemetry import Tracing

SYSTEM = "ferry"
#: OpenTelemetry's advised buckets for messaging.client.operation.duration (seconds).
DURATION_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                      7.5, 10.0)
_meter: metrics.Meter | None = None
_instruments: dict[str, Any] = {}


def _instrument(name: str) -> Any:
    """The process's instrument `name` (made once, on the global meter provider's proxy)."""
    global _meter
    found = _instruments.get(name)
    if found is not None:
        return found
    if _meter is None:
        _meter = metrics.get_meter("ferry.client")
    if name == "duration":
        found = _meter.create_histogram(
            "messaging.client.operation.duration", "s", "Duration of a messaging operation",
            explicit_bucket_boundaries_advisory=list(DURATION_BUCKETS_S))
    elif name == "sent":
        found = _meter.create_counter("messaging.client.sent.messages", "{message}",
                                      "Messages a producer sent")
    else:
        found = _meter.create_counter("messaging.client.consumed.messages", "{message}",
                                      "Messages a consumer delivered to the application")
    _instruments[name] = found
    return found


def _live(instrument: Any) -> bool:
    """Whether `instrument` records anything: False while it is the API's proxy with no
    MeterProvider behind it yet (its calls do nothing then); a provider set later makes
    it live at once."""
    return getattr(instrument, "_real_instrument", instrument) is not None


class SendMetrics:
    """A producer's: `sent(topic, n, seconds, error)` once per SEND request."""

    def __init__(self) -> None:
        self._sent = _instrument("sent")
        self._duration = _instrument("duration")
        self._attrs: dict[str, Mapping[str, str]] = {}

    def sent(self, topic: str, count: int, seconds: float, error: str | None = None) -> None:
        if not _live(self._sent):
            return
        attrs = self._attrs.get(topic)
        if attrs is None:
            attrs = self._attrs[topic] = {"messaging.system": SYSTEM,
                                          "messaging.operation.name": "send",
                                          "messaging.operation.type": "send",
                                          "messaging.destination.name": topic}
        if error is not None:
            attrs = {**attrs, "error.type": error}
        self._sent.add(count, attrs)
        self._duration.record(seconds, attrs)


class ConsumeMetrics:
    """A consumer's: `received(batch, tracing)` once per batch handed to the application
    (counted, and its traced records given `receive` spans)."""

    def __init__(self, group: str) -> None:
        self.group = group
        self._consumed = _instrument("consumed")
        self._attrs: dict[str, Mapping[str, str]] = {}

    def consumed(self, topic: str, count: int) -> None:
        attrs = self._attrs.get(topic)
        if attrs is None:
            attrs = self._attrs[topic] = {"messaging.system": SYSTEM,
                                          "messaging.operation.name": "receive",
                                          "messaging.operation.type": "receive",
                                          "messaging.destination.name": topic,
                                          "messaging.consumer.group.name": self.group}
        self._consumed.add(count, attrs)

    def received(self, batch: Mapping[Any, list[Any]], tr: Tracing) -> None:
        """Count a batch (records by TopicQueue) handed to the application; trace it."""
        consumed = self._consumed
        if getattr(consumed, "_real_instrument", consumed) is not None:   # _live, inline
            for tq, records in batch.items():
                self.consumed(tq.topic, len(records))
        if tr.enabled:
            trace_received(tr, batch, self.group)

    def received_one(self, tq: Any, record: Any, tr: Tracing) -> None:
        """`received` of one record of `tq` (an `async for` step), without building a batch."""
        consumed = self._consumed
        if getattr(consumed, "_real_instrument", consumed) is not None:
            self.consumed(tq.topic, 1)
        if tr.enabled:
            trace_received(tr, {tq: [record]}, self.group)
