"""A service's metrics: an OpenTelemetry MeterProvider read by Prometheus at `GET /metrics`.

Every service app owns one `Metrics` (`service_app` makes it and serves
`/metrics` from it): a MeterProvider of its own with a Prometheus reader in a
registry of its own, so that two services in one process (a test's brokers)
keep apart. Services register observable instruments (`observe`): a callback
reads the counters the service keeps anyway for /v1/stats at scrape time, so
the produce and consume paths do no work for metrics. `histogram` gives a
synchronous histogram for what only the moment knows (a delayed message's
lateness).

Cardinality is bounded: the values of the topic and group labels
(`CAPPED_LABELS`) an instrument reports are capped at FERRY_METRICS_MAX_LABEL_VALUES
distinct values (default 1000); the values seen after that are reported as
"_other" (their observations summed). FERRY_METRICS=off keeps `/metrics`
serving an empty document and registers no instruments (for comparing cost).
See docs/metrics.md.
"""
from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Literal

from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.metrics import CallbackOptions, Histogram, Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.resources import Resource
from prometheus_client import CollectorRegistry, generate_latest

from ferry.env import parse_bool

log = logging.getLogger(__name__)

METRICS_ENV = "FERRY_METRICS"
MAX_LABEL_VALUES_ENV = "FERRY_METRICS_MAX_LABEL_VALUES"
DEFAULT_MAX_LABEL_VALUES = 1000
#: The label a value beyond the cap is reported under.
OTHER = "_other"
#: The attributes (OpenTelemetry's messaging names) whose values are capped.
TOPIC = "messaging.destination.name"
GROUP = "messaging.consumer.group.name"
CAPPED_LABELS = (TOPIC, GROUP)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

Kind = Literal["counter", "gauge"]
Reading = Iterable[tuple[float, Mapping[str, Any]]]


def metrics_enabled() -> bool:
    """FERRY_METRICS: on unless set to off."""
    return parse_bool(os.environ.get(METRICS_ENV, "on"), METRICS_ENV)


def max_label_values() -> int:
    """FERRY_METRICS_MAX_LABEL_VALUES: the cap on one label's distinct values (at least 1)."""
    raw = os.environ.get(MAX_LABEL_VALUES_ENV, str(DEFAULT_MAX_LABEL_VALUES))
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{MAX_LABEL_VALUES_ENV} must be a whole number, not {raw!r}") from None
    if value < 1:
        raise ValueError(f"{MAX_LABEL_VALUES_ENV} must be at least 1, not {value}")
    return value


class LabelCap:
    """The values one instrument's capped labels may take: the first `limit` seen, then OTHER."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._seen: dict[str, set[str]] = {}

    def value(self, label: str, value: str) -> str:
        seen = self._seen.setdefault(label, set())
        if value in seen:
            return value
        if len(seen) >= self.limit:
            return OTHER
        seen.add(value)
        return value

    def apply(self, reading: Reading) -> list[Observation]:
        """The observations of `reading` with capped labels, those folded into OTHER summed."""
        summed: dict[tuple[tuple[str, Any], ...], float] = {}
        for amount, attributes in reading:
            attrs = {k: (self.value(k, str(v)) if k in CAPPED_LABELS else v)
                     for k, v in attributes.items()}
            key = tuple(sorted(attrs.items()))
            summed[key] = summed.get(key, 0) + amount
        return [Observation(amount, dict(key)) for key, amount in summed.items()]


class Metrics:
    """One service's meter and its Prometheus registry: `observe`, `histogram`, `render`."""

    def __init__(self, service: str, *, enabled: bool | None = None,
                 label_limit: int | None = None) -> None:
        self.service = service
        self.enabled = metrics_enabled() if enabled is None else enabled
        self.label_limit = max_label_values() if label_limit is None else label_limit
        self.registry = CollectorRegistry(auto_describe=False)
        self._provider: MeterProvider | None = None
        self._reads: dict[str, list[Callable[[], Reading]]] = {}
        if self.enabled:
            # A registry of this service's own: two services may share a process.
            reader = PrometheusMetricReader(scope_info_enabled=False, registry=self.registry)
            self._provider = MeterProvider(
                metric_readers=[reader], shutdown_on_exit=False,
                resource=Resource.create({"service.name": f"ferry-{service}"}))
            self.meter = self._provider.get_meter("ferry")

    def observe(self, name: str, kind: Kind, unit: str, description: str,
                read: Callable[[], Reading]) -> None:
        """An observable instrument: `read()` at each scrape gives (value, attributes) pairs.

        "counter": a monotonic total (Prometheus `_total`); "gauge": a value of the moment.
        Observing a name again adds a source to the same instrument (same kind and unit)."""
        if self._provider is None:
            return
        if name in self._reads:  # a second source of the same instrument (wire and HTTP)
            self._reads[name].append(read)
            return
        reads = self._reads[name] = [read]
        cap = LabelCap(self.label_limit)

        def callback(_: CallbackOptions) -> Iterable[Observation]:
            return cap.apply(reading for r in reads for reading in r())

        if kind == "counter":
            self.meter.create_observable_counter(name, [callback], unit, description)
        else:
            self.meter.create_observable_gauge(name, [callback], unit, description)

    def histogram(self, name: str, unit: str, description: str,
                  boundaries: tuple[float, ...] | None = None) -> Histogram | None:
        """A synchronous histogram (None with metrics off)."""
        if self._provider is None:
            return None
        return self.meter.create_histogram(
            name, unit, description,
            explicit_bucket_boundaries_advisory=list(boundaries) if boundaries else None)

    def render(self) -> bytes:
        """The Prometheus text exposition of every instrument now."""
        return generate_latest(self.registry) if self._provider is not None else b""

    def shutdown(self) -> None:
        provider, self._provider = self._provider, None
        if provider is not None:
            provider.shutdown()


def single(value: float, **attributes: Any) -> Reading:
    """One observation (a gauge or counter without per-topic labels)."""
    return [(value, attributes)]


#: One instrument read from a statistics document: its field, kind, unit and description.
Field = tuple[str, Kind, str, str]


def observe_fields(metrics: Metrics, prefix: str, read: Callable[[], Mapping[str, Any]],
                   fields: Mapping[str, Field]) -> None:
    """Instruments `<prefix>.<name>` each reading one numeric field of `read()` (a service's
    /v1/stats document or part of it) at scrape time."""
    for name, (key, kind, unit, description) in fields.items():
        metrics.observe(f"{prefix}.{name}", kind, unit, description,
                        lambda key=key: single(read().get(key, 0)))  # type: ignore[misc]


def observe_counts(metrics: Metrics, name: str, label: str, description: str,
                   read: Callable[[], Mapping[str, int]], unit: str = "{event}") -> None:
    """A counter `name` with one series per key of `read()` (a Counter of outcomes), the key
    as `label`."""
    metrics.observe(name, "counter", unit, description,
                    lambda: [(n, {label: key}) for key, n in read().items()])
