"""A message's trace as a timeline of hops, from the spans the trace topic holds.

The spans come from `ferry.client.admin.trace_query.spans_of_message(namesrv,
msg_id)` (span JSON, docs/tracing.md): every span keyed by the message id,
and the rest of each trace found. The timeline is one row per span in start
order: its hop (`ferry.hop`), service, where it happened (broker, queue,
offset, group), its offset from the first span and its duration, and its
outcome (`ferry.outcome`, else the span status), plus the left/width of its
bar as percentages of the whole trace, so that the page draws it with CSS
alone (no JavaScript).
"""
from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from ferry.auth.credentials import Credentials

log = logging.getLogger("ferry_console")

NS_PER_MS = 1_000_000
MIN_BAR_PERCENT = 0.5   # a span of no visible length still gets a sliver


@dataclass(frozen=True)
class Hop:
    """One row of the timeline."""

    hop: str
    name: str
    service: str
    where: str
    start_ms: float      # after the trace's first span started
    duration_ms: float
    outcome: str
    failed: bool
    left_percent: float
    width_percent: float
    trace_id: str
    span_id: str


def _where(attrs: dict[str, Any]) -> str:
    parts = []
    if attrs.get("ferry.broker"):
        parts.append(str(attrs["ferry.broker"]))
    if attrs.get("messaging.destination.name"):
        parts.append(str(attrs["messaging.destination.name"]))
    if attrs.get("messaging.destination.partition.id") is not None:
        parts.append(f"queue {attrs['messaging.destination.partition.id']}")
    if attrs.get("ferry.queue_offset") is not None:
        parts.append(f"offset {attrs['ferry.queue_offset']}")
    if attrs.get("messaging.consumer.group.name"):
        parts.append(f"group {attrs['messaging.consumer.group.name']}")
    if attrs.get("ferry.reconsume_times"):
        parts.append(f"attempt {attrs['ferry.reconsume_times']}")
    return " · ".join(parts)


def _is_span(doc: object) -> bool:
    """A span JSON dict with str ids and int times (anything else in %TRACE% is skipped)."""
    def whole(v: object) -> bool:
        return isinstance(v, int) and not isinstance(v, bool)
    return (isinstance(doc, dict) and isinstance(doc.get("trace_id"), str)
            and isinstance(doc.get("span_id"), str) and whole(doc.get("start_ns"))
            and whole(doc.get("end_ns")))


def timeline(spans: Iterable[dict[str, Any]]) -> list[Hop]:
    """The hops of `spans` (span JSON dicts) in start order; malformed spans are skipped."""
    good = [s for s in spans if _is_span(s)]
    if not good:
        return []
    good.sort(key=lambda s: (s["start_ns"], s["end_ns"]))
    first = good[0]["start_ns"]
    total = max(max(s["end_ns"] for s in good) - first, 1)
    rows = []
    for s in good:
        attrs = s.get("attributes")
        attrs = attrs if isinstance(attrs, dict) else {}
        status = str(s.get("status") or "UNSET")
        outcome = str(attrs.get("ferry.outcome") or ("failed" if status == "ERROR" else
                                                     "ok" if status == "OK" else ""))
        left = (s["start_ns"] - first) / total * 100
        width = max((s["end_ns"] - s["start_ns"]) / total * 100, MIN_BAR_PERCENT)
        rows.append(Hop(
            hop=str(attrs.get("ferry.hop") or s.get("name") or "?"), name=str(s.get("name", "")),
            service=str(s.get("service") or attrs.get("ferry.service") or ""),
            where=_where(attrs), start_ms=(s["start_ns"] - first) / NS_PER_MS,
            duration_ms=(s["end_ns"] - s["start_ns"]) / NS_PER_MS, outcome=outcome,
            failed=status == "ERROR" or outcome not in ("", "ok"),
            left_percent=round(min(left, 100 - MIN_BAR_PERCENT), 3),
            width_percent=round(min(width, 100 - min(left, 100 - MIN_BAR_PERCENT)), 3),
            trace_id=str(s.get("trace_id", "")), span_id=str(s.get("span_id", ""))))
    return rows


def _reader() -> Callable[..., Any] | None:
    try:
        from ferry.client.admin.trace_query import spans_of_message
    except ImportError:   # a ferry without the trace reader: the page says so
        return None
    return spans_of_message  # type: ignore[no-any-return]


async def spans_of(namesrv: str, msg_id: str, credentials: Credentials | None = None
                   ) -> list[dict[str, Any]] | None:
    """The spans of `msg_id` from the trace topic, read with `credentials` (the user's);
    None when this ferry cannot read traces."""
    reader = _reader()
    if reader is None:
        return None
    if inspect.iscoroutinefunction(reader):
        result = await reader(namesrv, msg_id, credentials)
    else:   # a blocking reader runs off the event loop
        result = await asyncio.to_thread(reader, namesrv, msg_id, credentials)
    return list(result)
