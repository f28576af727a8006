"""A Tracing that keeps spans in memory, installed as the process's current one for a test."""
from __future__ import annotations

from collections.abc import Iterator

import pytest
from ferry.telemetry import Tracing, TracingSettings
from ferry.telemetry import setup as tracing_setup
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter


@pytest.fixture
def spans(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemorySpanExporter]:
    """Tracing on (ratio 1, no file or topic exporter) for this test; yields the span sink."""
    tr = Tracing("unit", TracingSettings(sample_ratio=1.0, trace_topic=False))
    assert tr.provider is not None
    memory = InMemorySpanExporter()
    tr.provider.add_span_processor(SimpleSpanProcessor(memory))
    monkeypatch.setattr(tracing_setup, "_current", tr)
    yield memory
    tr.shutdown()
