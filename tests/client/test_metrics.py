"""The clients' OpenTelemetry metrics (docs/metrics.md, Clients) against a real mesh: an
application that sets a MeterProvider reads how many messages it sent and consumed."""
from __future__ import annotations

import urllib.request
from pathlib import Path
from typing import Any

import pytest
from ferry import Consumer, Producer
from opentelemetry import metrics
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from prometheus_client.parser import text_string_to_metric_families

from tests.client.conftest import Mesh, start_mesh, unique
from tests.client.util import FAST, collect
from tests.support.procs import Etcd

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


async def test_a_broker_caps_its_topic_label_values(etcd: Etcd, tmp_path: Path) -> None:
    """FERRY_METRICS_MAX_LABEL_VALUES=2 on a real broker: four topics give two series of
    their own and `_other` with the rest (docs/metrics.md, Bounded cardinality)."""
    mesh = start_mesh(etcd, tmp_path / "mesh", broker_names=("broker-a",),
                      broker_env={"FERRY_METRICS_MAX_LABEL_VALUES": "2"})
    try:
        topics = [unique(f"capped{i}") for i in range(4)]
        async with Producer(namesrv=mesh.namesrv) as producer:
            for n, topic in enumerate(topics, start=1):
                for _ in range(n):
                    await producer.send(topic, b"x")
            await producer.flush()
        url = f"http://127.0.0.1:{mesh.brokers['broker-a'].http_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as resp:
            text = resp.read().decode()
        stored = {s.labels["messaging_destination_name"]: s.value
                  for family in text_string_to_metric_families(text)
                  for s in family.samples if s.name == "ferry_broker_topic_messages_total"}
        ours = {t: v for t, v in stored.items() if t in topics}
        assert len(ours) <= 2 and "_other" in stored
        assert sum(ours.values()) + stored["_other"] >= 1 + 2 + 3 + 4
        assert len(stored) == 3   # two values and `_other`, whatever else the broker holds
    finally:
        mesh.stop()
