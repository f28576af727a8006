"""Spans as JSON: one format for the JSON-lines files and the `%TRACE%` topic's bodies.

    {"trace_id": 32 hex, "span_id": 16 hex, "parent_span_id": 16 hex | null,
     "name", "kind", "start_ns", "end_ns", "status": "OK" | "ERROR" | "UNSET",
     "status_message", "service", "attributes": {...},
     "links": [{"trace_id", "span_id", "attributes"}], "events": [{"name", "time_ns", "attributes"}]}

`JsonLinesExporter` appends one such object per line to
`<dir>/<service>-<pid>.jsonl`; it runs behind a BatchSpanProcessor, in that
processor's thread, never on the traced code's path.
"""
from __future__ import annotations

import json
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult


def _attrs(attributes: Any) -> dict[str, Any]:
    # Sequence attribute values arrive as tuples: JSON writes them as lists anyway.
    return {k: list(v) if isinstance(v, tuple) else v for k, v in (attributes or {}).items()}


def span_json(span: ReadableSpan) -> dict[str, Any]:
    """A finished span as the JSON object above."""
    ctx = span.get_span_context()
    parent = span.parent
    resource = span.resource.attributes if span.resource is not None else {}
    return {
        "trace_id": f"{ctx.trace_id:032x}" if ctx else None,
        "span_id": f"{ctx.span_id:016x}" if ctx else None,
        "parent_span_id": f"{parent.span_id:016x}" if parent is not None else None,
        "name": span.name,
        "kind": span.kind.name,
        "start_ns": span.start_time,
        "end_ns": span.end_time,
        "status": span.status.status_code.name,
        "status_message": span.status.description,
        "service": resource.get("service.name"),
        "attributes": _attrs(span.attributes),
        "links": [{"trace_id": f"{link.context.trace_id:032x}",
                   "span_id": f"{link.context.span_id:016x}",
                   "attributes": _attrs(link.attributes)} for link in span.links],
        "events": [{"name": ev.name, "time_ns": ev.timestamp, "attributes": _attrs(ev.attributes)}
                   for ev in span.events],
    }


def read_jsonl(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every span of a JSON-lines file (a torn last line, from a process killed mid-write,
    is skipped)."""
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return out


def read_trace_dir(directory: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every span of every `*.jsonl` file in `directory`, sorted by start time."""
    spans = [s for p in sorted(Path(directory).glob("*.jsonl")) for s in read_jsonl(p)]
    spans.sort(key=lambda s: s.get("start_ns") or 0)
    return spans


class JsonLinesExporter(SpanExporter):
    """Appends spans as JSON lines to `<directory>/<service>-<pid>.jsonl`."""

    def __init__(self, directory: str | os.PathLike[str], service: str) -> None:
        Path(directory).mkdir(parents=True, exist_ok=True)
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in service)
        self.path = Path(directory) / f"{safe}-{os.getpid()}.jsonl"
        self._lock = threading.Lock()
        self._file: Any = None

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        lines = "".join(json.dumps(span_json(s), default=str) + "\n" for s in spans)
        try:
            with self._lock:
                if self._file is None:
                    self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - kept open
                self._file.write(lines)
                self._file.flush()   # readers (tests, the console, spark) see whole lines
        except OSError:
            return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return True
