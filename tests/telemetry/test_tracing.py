"""ferry.telemetry: settings, setup, propagation in properties, hop spans and span JSON."""
from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from ferry.codec import TRACEPARENT, TRACESTATE, MessageFlag
from ferry.telemetry import (
    HOPS,
    JsonLinesExporter,
    Tracing,
    TracingConfigError,
    TracingSettings,
    extract,
    hop_span,
    inject,
    is_traced,
    links_of,
    read_jsonl,
    read_trace_dir,
    span_json,
    start_hop,
    tracing,
)
from ferry.telemetry import setup as tracing_setup
from ferry.telemetry.spans import BATCH_MESSAGE_OPERATION
from opentelemetry import trace
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode


def test_settings_defaults_and_environment() -> None:
    s = TracingSettings.from_env({})
    assert (s.enabled, s.sample_ratio, s.trace_dir, s.otlp_endpoint, s.trace_topic) == \
        (True, 0.001, None, None, True)
    s = TracingSettings.from_env({"FERRY_TRACING": "off", "FERRY_TRACE_SAMPLE_RATIO": "0",
                                  "FERRY_TRACE_DIR": "/tmp/x", "FERRY_TRACE_TOPIC": "off",
                                  "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"})
    assert (s.enabled, s.sample_ratio, s.trace_dir, s.otlp_endpoint, s.trace_topic) == \
        (False, 0.0, "/tmp/x", "http://127.0.0.1:4318", False)


@pytest.mark.parametrize("env", [{"FERRY_TRACING": "maybe"}, {"FERRY_TRACE_SAMPLE_RATIO": "x"},
                                 {"FERRY_TRACE_SAMPLE_RATIO": "1.5"}])
def test_bad_settings_raise_a_clear_error(env: dict[str, str]) -> None:
    with pytest.raises(TracingConfigError, match="FERRY_TRAC"):
        TracingSettings.from_env(env)


def test_off_makes_no_span_and_never_samples() -> None:
    tr = Tracing("svc", TracingSettings(enabled=False, sample_ratio=1.0))
    assert not tr.enabled and tr.provider is None and not tr.sample()
    assert not tracing().enabled or tracing().service  # before setup: disabled


def test_hop_span_before_setup_yields_the_non_recording_span(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tracing_setup, "_current", Tracing())
    with hop_span("send", destination="T", msg_id="AB") as span:
        assert span is trace.INVALID_SPAN and not span.is_recording()


def test_sampling_ratio_zero_and_one() -> None:
    assert not any(Tracing("s", TracingSettings(sample_ratio=0.0, trace_topic=False)).sample()
                   for _ in range(1000))
    assert all(Tracing("s", TracingSettings(sample_ratio=1.0, trace_topic=False)).sample()
               for _ in range(100))


def test_inject_and_extract_round_trip(spans: InMemorySpanExporter) -> None:
    props: dict[str, str] = {"user": "v"}
    assert extract(props) is None
    with hop_span("send", destination="T", msg_id="M1") as span:
        assert inject(props)
    assert props[TRACEPARENT].startswith("00-") and TRACESTATE not in props
    ctx = extract(props)
    assert ctx is not None
    sc = trace.get_current_span(ctx).get_span_context()
    assert sc.trace_id == span.get_span_context().trace_id and sc.is_remote
    assert extract({TRACEPARENT: "garbage"}) is None
    assert is_traced(int(MessageFlag.TRACED) | 1) and not is_traced(1)


def test_hop_span_attributes_kind_and_parent(spans: InMemorySpanExporter) -> None:
    props: dict[str, str] = {}
    with hop_span("send", destination="orders", msg_id="M1",
                  attributes={"messaging.message.body.size": 3, "ferry.broker": None}):
        inject(props)
    with hop_span("receive", destination="orders", msg_id="M1", parent=extract(props),
                  attributes={"messaging.consumer.group.name": "g"}):
        pass
    send, receive = spans.get_finished_spans()
    assert send.name == "send orders" and send.kind is SpanKind.PRODUCER
    assert dict(send.attributes or {}) == {
        "messaging.system": "ferry", "messaging.operation.type": "send",
        "messaging.operation.name": "send", "messaging.destination.name": "orders",
        "messaging.message.id": "M1", "ferry.hop": "send", "ferry.service": "unit",
        "messaging.message.body.size": 3}
    assert receive.kind is SpanKind.CONSUMER
    assert receive.parent is not None and receive.parent.span_id == send.context.span_id
    assert receive.context.trace_id == send.context.trace_id


def test_every_hop_has_an_operation_type_and_kind() -> None:
    assert set(HOPS) == {"send", "store", "schedule", "deliver", "half", "end", "check",
                         "receive", "process", "retry", "dlq", "bridge", "task", "dedup"}
    assert {op for op, _ in HOPS.values()} == {"create", "send", "receive", "process", "settle"}


def test_every_hop_span_names_its_operation(spans: InMemorySpanExporter) -> None:
    for hop in HOPS:
        with hop_span(hop, destination="T"):
            pass
    start_hop("send", destination="T", operation=BATCH_MESSAGE_OPERATION).end()
    done = spans.get_finished_spans()
    assert len(done) == len(HOPS) + 1
    for span in done:
        attrs = dict(span.attributes or {})
        assert attrs["messaging.operation.name"], span.name
        assert span.name == f"{attrs['messaging.operation.name']} T"
        assert attrs["messaging.operation.type"] in ("create", "send", "receive", "process",
                                                     "settle")
    assert dict(done[-1].attributes or {})["messaging.operation.type"] == "create"


def test_a_failing_block_marks_the_span_failed(spans: InMemorySpanExporter) -> None:
    with pytest.raises(RuntimeError), hop_span("process", destination="T", msg_id="M"):
        raise RuntimeError("handler broke")
    (span,) = spans.get_finished_spans()
    assert span.status.status_code is StatusCode.ERROR
    assert span.attributes is not None and span.attributes["ferry.outcome"] == "failed"


def test_batch_span_links_each_message(spans: InMemorySpanExporter) -> None:
    contexts = []
    for i in range(3):
        props: dict[str, str] = {}
        with hop_span("send", destination="T", msg_id=f"M{i}"):
            inject(props)
        contexts.append(extract(props))
    with hop_span("process", destination="T", links=links_of([*contexts, None]),
                  attributes={"messaging.batch.message_count": 3}):
        pass
    batch = spans.get_finished_spans()[-1]
    assert len(batch.links) == 3
    doc = span_json(batch)
    assert [link["trace_id"] for link in doc["links"]] == \
        [f"{s.context.trace_id:032x}" for s in spans.get_finished_spans()[:3]]


def test_span_json_and_jsonl_files(spans: InMemorySpanExporter, tmp_path: os.PathLike[str]
                                   ) -> None:
    with hop_span("store", destination="T", msg_id="M", attributes={"ferry.queue_offset": 7}):
        pass
    (span,) = spans.get_finished_spans()
    doc = span_json(span)
    assert set(doc) == {"trace_id", "span_id", "parent_span_id", "name", "kind", "start_ns",
                        "end_ns", "status", "status_message", "service", "attributes", "links",
                        "events"}
    assert len(doc["trace_id"]) == 32 and len(doc["span_id"]) == 16
    assert (doc["parent_span_id"], doc["kind"], doc["service"], doc["status"]) == \
        (None, "SERVER", "unit", "UNSET")
    assert doc["attributes"]["ferry.queue_offset"] == 7 and doc["end_ns"] >= doc["start_ns"]
    exporter = JsonLinesExporter(tmp_path, "broker a")
    exporter.export([span, span])
    exporter.shutdown()
    assert exporter.path.name == f"broker_a-{os.getpid()}.jsonl"
    with open(exporter.path, "a") as f:
        f.write('{"torn": ')   # a process killed mid-line
    assert read_jsonl(exporter.path) == [json.loads(json.dumps(doc))] * 2
    assert len(read_trace_dir(tmp_path)) == 2


def test_file_exporter_behind_a_batch_processor(tmp_path: os.PathLike[str],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    tr = Tracing("svc", TracingSettings(trace_dir=str(tmp_path), trace_topic=False))
    monkeypatch.setattr(tracing_setup, "_current", tr)
    with hop_span("send", destination="T", msg_id="X"):
        pass
    tr.shutdown()    # flushes the batch processor
    (doc,) = read_trace_dir(tmp_path)
    assert doc["attributes"]["messaging.message.id"] == "X" and doc["service"] == "svc"
    assert not tr.enabled


def test_setup_is_once_per_process_and_refreshes_from_the_environment(
        monkeypatch: pytest.MonkeyPatch, tmp_path: os.PathLike[str]) -> None:
    monkeypatch.setattr(tracing_setup, "_current", Tracing())
    monkeypatch.setenv("FERRY_TRACING", "off")
    first = tracing_setup.setup_tracing("svc")
    assert first is tracing() and not first.enabled and first.service == "svc"
    monkeypatch.setenv("FERRY_TRACING", "on")
    monkeypatch.setenv("FERRY_TRACE_DIR", str(tmp_path))
    monkeypatch.setenv("FERRY_TRACE_TOPIC", "off")
    again = tracing_setup.setup_tracing("other")
    assert again is first and again.enabled and again.service == "svc"
    assert [type(e) for e in again.exporters] == [JsonLinesExporter]
    again.shutdown()


def test_docs_hop_table_matches_the_code() -> None:
    doc = Path(__file__).resolve().parents[2] / "docs" / "tracing.md"
    rows = {}
    for line in doc.read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| `") and len(cells) == 5:
            rows[cells[0].strip("`")] = (cells[1], cells[2].split()[0])
    assert rows == {hop: (op, kind.name) for hop, (op, kind) in HOPS.items()}
    send_row = next(line for line in doc.read_text(encoding="utf-8").splitlines()
                    if line.startswith("| `send` |"))
    assert f"operation type and name `{BATCH_MESSAGE_OPERATION}`" in send_row


class _TopicStandIn(SpanExporter):
    """Stands in for the trace-topic exporter: remembers its namesrv, drops the spans."""

    def __init__(self, namesrv: str, service: str) -> None:
        self.namesrv = namesrv

    def export(self, spans: Any) -> SpanExportResult:
        return SpanExportResult.SUCCESS


def _targets(tr: Tracing) -> list[str]:
    return [e.namesrv for e in tr.exporters if isinstance(e, _TopicStandIn)]


def test_the_first_namesrv_stays_the_trace_topic_target(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tracing_setup, "_current", Tracing())
    monkeypatch.setattr(tracing_setup, "_trace_topic_exporter", _TopicStandIn)
    for k in ("FERRY_TRACING", "FERRY_TRACE_DIR", "FERRY_TRACE_TOPIC",
              "OTEL_EXPORTER_OTLP_ENDPOINT"):
        monkeypatch.delenv(k, raising=False)
    tr = tracing_setup.setup_tracing("svc")           # a service with no namesrv yet
    provider = tr.provider
    assert provider is not None and _targets(tr) == []
    tracing_setup.setup_tracing("svc", namesrv="127.0.0.1:1")   # its first: added in place
    assert tr.provider is provider and _targets(tr) == ["127.0.0.1:1"]
    tracing_setup.setup_tracing("svc", namesrv="127.0.0.1:2")   # another cluster's client
    assert tr.provider is provider and _targets(tr) == ["127.0.0.1:1"]
    tr.shutdown()   # an explicit shutdown starts afresh
    tracing_setup.setup_tracing("svc", namesrv="127.0.0.1:3")
    assert _targets(tr) == ["127.0.0.1:3"]
    tr.shutdown()


def test_a_rebuild_stops_the_old_provider_off_the_calling_thread(
        monkeypatch: pytest.MonkeyPatch, tmp_path: os.PathLike[str]) -> None:
    monkeypatch.setattr(tracing_setup, "_current", Tracing())
    monkeypatch.setattr(tracing_setup, "_trace_topic_exporter", _TopicStandIn)
    monkeypatch.delenv("FERRY_TRACE_DIR", raising=False)
    monkeypatch.setenv("FERRY_TRACING", "on")
    tr = tracing_setup.setup_tracing("svc", namesrv="127.0.0.1:1")
    old = tr.provider
    assert old is not None
    release, stopped_on = threading.Event(), []
    real_shutdown = old.shutdown

    def slow_shutdown() -> None:   # an exporter thread that takes its time to join
        stopped_on.append(threading.current_thread())
        release.wait(10)
        real_shutdown()
    monkeypatch.setattr(old, "shutdown", slow_shutdown)
    monkeypatch.setenv("FERRY_TRACE_DIR", str(tmp_path))   # a settings change: rebuilt
    again = tracing_setup.setup_tracing("svc", namesrv="127.0.0.1:2")
    try:
        assert again is tr and tr.provider is not old and tr.enabled
        assert [type(e) for e in tr.exporters] == [JsonLinesExporter, _TopicStandIn]
        assert _targets(tr) == ["127.0.0.1:1"]
    finally:
        release.set()
    deadline = time.monotonic() + 10
    while not stopped_on and time.monotonic() < deadline:
        time.sleep(0.01)
    assert stopped_on and stopped_on[0] is not threading.current_thread()
    tr.shutdown()
