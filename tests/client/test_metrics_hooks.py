"""The clients' metrics hooks with and without a MeterProvider (docs/metrics.md, Clients).

With none set, the hooks skip the API's no-op instruments (`async for` calls the consume
hook per record); an application that sets its provider later is counted from then on,
by the instruments made before. Each case runs in a fresh interpreter: a process sets
its global MeterProvider once.
"""
from __future__ import annotations

import subprocess
import sys

SCRIPT = r'''
from opentelemetry import metrics
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from ferry.client.core.message import TopicQueue
from ferry.client.core.metrics import ConsumeMetrics, SendMetrics, _live
from ferry.telemetry import Tracing

consume, send = ConsumeMetrics("g"), SendMetrics()     # made before any provider
batch = {TopicQueue("t", "broker-a", 0): [object()] * 3}
assert not _live(consume._consumed) and not _live(send._sent)
consume.received(batch, Tracing())                       # no provider: not counted
send.sent("t", 5, 0.001)
reader = InMemoryMetricReader()
metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
assert _live(consume._consumed) and _live(send._sent)
consume.received(batch, Tracing())
consume.received(batch, Tracing())
send.sent("t", 7, 0.002)
sums = {m.name: sum(p.value for p in m.data.data_points if hasattr(p, "value"))
        for rm in reader.get_metrics_data().resource_metrics for sm in rm.scope_metrics
        for m in sm.metrics}
print(sums["messaging.client.consumed.messages"], sums["messaging.client.sent.messages"])
'''


def test_hooks_count_from_when_a_provider_is_set_by_instruments_made_before() -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["6", "7"]
