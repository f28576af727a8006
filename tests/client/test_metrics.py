"""The clients' OpenTelemetry metrics (docs/metrics.md, Clients) against a real mesh: an
application that sets a MeterProvider reads how many messages it sent and consumed."""
from __future__ import annotations

from typing import Any

import pytest
from ferry import Consumer, Producer
from opentelemetry import metrics
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from tests.client.conftest import Mesh, unique
from tests.client.util import FAST, collect

pytestmark = pytest.mark.integration

# The global MeterProvider can be set once per process: this module's, set at first use.
_READER = InMemoryMetricReader()


def _reader() -> InMemoryMetricReader:
    if not isinstance(metrics.get_meter_provider(), MeterProvider):
        metrics.set_meter_provider(MeterProvider(metric_readers=[_READER]))
    return _READER


def _points(reader: InMemoryMetricReader, name: str, topic: str) -> list[Any]:
    data = reader.get_metrics_data()
    return [p for rm in (data.resource_metrics if data else []) for sm in rm.scope_metrics
            for m in sm.metrics if m.name == name for p in m.data.data_points
            if p.attributes.get("messaging.destination.name") == topic]


async def test_sent_consumed_and_send_duration_are_counted(mesh: Mesh) -> None:
    reader = _reader()
    topic, group = unique("metered"), unique("g")
    async with Producer(namesrv=mesh.namesrv) as producer:
        for i in range(30):
            await producer.send(topic, f"m{i}".encode())
        await producer.flush()
    async with Consumer(topic, group=group, namesrv=mesh.namesrv,
                        auto_offset_reset="earliest", **FAST) as consumer:
        got = (await collect([consumer], 30))[0]
    assert len(got) == 30
    sent = _points(reader, "messaging.client.sent.messages", topic)
    assert sum(p.value for p in sent) == 30
    assert all("error.type" not in p.attributes and p.attributes["messaging.system"] == "ferry"
               for p in sent)
    consumed = _points(reader, "messaging.client.consumed.messages", topic)
    assert sum(p.value for p in consumed) == 30
    assert {p.attributes["messaging.consumer.group.name"] for p in consumed} == {group}
    durations = _points(reader, "messaging.client.operation.duration", topic)
    assert sum(p.count for p in durations) >= 1
    assert all(p.attributes["messaging.operation.name"] == "send" for p in durations)
