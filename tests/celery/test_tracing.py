"""A traced message's context through the Celery bridge, the ferry:// transport and a worker.

The message is sent with `trace=True`; a real `ferry celery-bridge` publishes it
as a task through `ferry://` to a real prefork worker. Every process writes
JSON-lines spans to one directory: the message's one trace holds the
producer's `send`, the bridge's `bridge` span, the transport's traced `send`,
and the worker's `task` span, in that order.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from ferry.client import Producer
from ferry.telemetry import read_trace_dir, tracing

from tests.celery.conftest import CeleryMesh, notes_db, proc_env, query, start_worker, wait_for
from tests.celery.test_bridge import start_bridge
from tests.client.conftest import unique
from tests.support.procs import Proc

pytestmark = pytest.mark.integration

TRACE_ENV = {"FERRY_TRACE_SAMPLE_RATIO": "0", "OTEL_BSP_SCHEDULE_DELAY": "200"}


def hops(spans: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(s["attributes"].get("ferry.hop"), s["service"])
            for s in sorted(spans, key=lambda s: s["start_ns"])]


async def test_trace_context_survives_the_bridge_and_the_transport(
        celery_mesh: CeleryMesh, tmp_path: Path, procs: list[Proc],
        monkeypatch: pytest.MonkeyPatch) -> None:
    traces = tmp_path / "traces"
    for k, v in {**TRACE_ENV, "FERRY_TRACE_DIR": str(traces)}.items():
        monkeypatch.setenv(k, v)
    topic, group, queue = unique("traced"), unique("bridge"), unique("echo-tasks")
    db = notes_db(tmp_path / "notes.db")
    env = proc_env(celery_mesh, queue, db, **TRACE_ENV, FERRY_TRACE_DIR=str(traces))
    try:
        async with Producer(namesrv=celery_mesh.namesrv) as producer:
            sent = await producer.send_and_wait(topic, b'{"n": 1}', trace=True)
            untraced = await producer.send_and_wait(topic, b'{"n": 2}')
        tracing().force_flush()
    finally:
        tracing().shutdown()
    procs.append(start_worker(celery_mesh, "wtrace", env, pool="prefork", concurrency=1))
    procs.append(start_bridge(celery_mesh, "bridge-trace", topic, group, env,
                              task="tests.celery.app.echo"))
    wait_for(lambda: len(query(db, "SELECT label FROM notes WHERE phase = 'echo'")) == 2, 60,
             "both messages ran as tasks")
    for proc in reversed(procs):   # a clean stop flushes each process's spans
        proc.stop()
    spans = read_trace_dir(traces)
    (trace_id,) = {s["trace_id"] for s in spans
                   if s["attributes"].get("messaging.message.id") == sent.msg_id
                   and s["attributes"].get("ferry.hop") == "send"}
    trace = [s for s in spans if s["trace_id"] == trace_id]
    got = hops(trace)
    bridge_at = got.index(("bridge", "ferry-celery-bridge"))
    assert got[0][0] == "send" and got.index(got[0]) < bridge_at   # the producer's send
    task_at = got.index(("task", "ferry-celery-worker"))
    assert bridge_at < task_at
    # The transport sent the task as a traced Ferry message, below the bridge span.
    assert ("send", "ferry-celery-bridge") in got[bridge_at:task_at]
    task = next(s for s in trace if s["attributes"].get("ferry.hop") == "task")
    assert task["attributes"]["ferry.outcome"] == "ok"
    assert task["attributes"]["messaging.message.id"] == sent.msg_id   # task id = message id
    # The untraced message made no span anywhere.
    assert not [s for s in spans if s["attributes"].get("messaging.message.id") == untraced.msg_id]
