"""ferry.telemetry: OpenTelemetry tracing across every hop of a message, and structured logs.

- `setup_tracing(service, namesrv=...)` / `tracing()`: the process's `Tracing`
  (environment: FERRY_TRACING, FERRY_TRACE_SAMPLE_RATIO, FERRY_TRACE_DIR,
  OTEL_EXPORTER_OTLP_ENDPOINT, FERRY_TRACE_TOPIC; see `settings`).
- `inject` / `extract`: W3C trace context in a message's `TRACEPARENT` /
  `TRACESTATE` properties (with `MessageFlag.TRACED` on the message).
- `hop_span`: the span of one hop, with the attributes every hop has.
- `span_json` / `read_jsonl` / `read_trace_dir`: the one JSON form of a span.
See docs/tracing.md.
"""
from __future__ import annotations

from ferry.telemetry.jsonl import JsonLinesExporter, read_jsonl, read_trace_dir, span_json
from ferry.telemetry.propagation import TRACED, extract, inject, is_traced
from ferry.telemetry.settings import TracingConfigError, TracingSettings
from ferry.telemetry.setup import (
    Tracing,
    client_service_name,
    reset_tracing,
    setup_tracing,
    tracing,
)
from ferry.telemetry.spans import HOPS, hop_span, links_of, start_hop

__all__ = [
    # setup
    "Tracing", "TracingSettings", "TracingConfigError", "reset_tracing", "setup_tracing",
    "tracing",
    "client_service_name",
    # propagation
    "TRACED", "inject", "extract", "is_traced",
    # spans
    "HOPS", "hop_span", "start_hop", "links_of",
    # span JSON
    "JsonLinesExporter", "span_json", "read_jsonl", "read_trace_dir",
]
