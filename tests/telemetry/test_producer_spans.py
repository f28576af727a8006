"""Producer send spans without processes: a failed send ends its span, and a batch's
spans follow the messaging conventions (the in-process broker of test_producer_unit)."""
from __future__ import annotations

import asyncio
from typing import Any

import pytest
from ferry.client import Message
from ferry.errors import BusyError
from ferry.telemetry import tracing
from ferry.telemetry.spans import BATCH_COUNT, HOP, OPERATION_NAME, OPERATION_TYPE, OUTCOME
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from tests.client.test_producer_unit import Broker, FakeFrame, _close_producers, _producer

__all__ = ["_close_producers"]   # the autouse fixture closing the stand-in producers
pytestmark = pytest.mark.usefixtures("_close_producers")


async def test_a_traced_send_refused_by_a_full_buffer_ends_its_span(
        spans: InMemorySpanExporter) -> None:
    gate = asyncio.Event()

    async def request(addr: str, code: int, fields: dict[str, Any], body: bytes = b"") -> FakeFrame:
        await gate.wait()
        return FakeFrame({"queue_offset": 0, "queue_id": fields["queue_id"]})

    p = _producer("t", buffer_memory_bytes=4 * 1024, max_block_ms=50)
    p._tracing = tracing()
    p._pool.request = request  # type: ignore[method-assign]
    futs = [await p.send("t", b"x" * 1000) for _ in range(3)]   # fills the buffer
    with pytest.raises(BusyError):
        await p.send("t", b"y" * 1000, trace=True)
    await asyncio.sleep(0)   # the span ends in the send future's done callback
    (busy,) = [s for s in spans.get_finished_spans()]
    assert busy.status.status_code is StatusCode.ERROR
    assert busy.attributes is not None and busy.attributes[OUTCOME] == "failed"
    gate.set()
    await asyncio.gather(*futs)


async def test_a_batch_has_one_send_span_and_a_create_span_per_traced_message(
        spans: InMemorySpanExporter) -> None:
    broker = Broker()
    p = _producer("t")
    p._tracing = tracing()
    p._pool.request = broker.request  # type: ignore[method-assign]
    await p.send_batch("t", [Message(b"a", trace=True), Message(b"b", trace=False),
                              Message(b"c", trace=True)])
    done = spans.get_finished_spans()
    creates = [s for s in done if s.attributes and s.attributes[OPERATION_TYPE] == "create"]
    sends = [s for s in done if s.attributes and s.attributes[OPERATION_TYPE] == "send"]
    assert len(creates) == 2 and len(sends) == 1
    (batch,) = sends
    assert batch.kind is SpanKind.PRODUCER and batch.attributes[BATCH_COUNT] == 3
    assert {(link.context.trace_id, link.context.span_id) for link in batch.links} == {
        (c.context.trace_id, c.context.span_id) for c in creates}
    for s in done:
        assert s.attributes is not None
        assert s.attributes[OPERATION_NAME] == s.attributes[OPERATION_TYPE]
        assert s.attributes[HOP] == "send" and s.name == f"{s.attributes[OPERATION_NAME]} t"
