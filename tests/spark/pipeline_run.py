"""A traced mesh run for the report's tests: plain and delayed messages, retries, a DLQ.

The mesh is namesrv, one broker and the delay scheduler, every process (this
one too) tracing only the messages sent with `trace=True`
(FERRY_TRACE_SAMPLE_RATIO=0) to JSON-lines files under one directory and to
`%TRACE%`. `run_scenario` sends and consumes, and returns what the test
itself saw: which messages, when each was sent and last handled, how many
retries and dead letters — the truth the report is checked against.
"""
from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ferry import Admin, Consumer, ConsumerRecord, Producer
from ferry.telemetry import read_trace_dir, tracing

from tests.client.conftest import Mesh, unique
from tests.client.util import FAST
from tests.delay_scheduler.conftest import SchedulerProc, start_scheduler
from tests.support.procs import Etcd

TRACE_ENV = {"FERRY_TRACE_SAMPLE_RATIO": "0", "FERRY_TRACING": "on", "FERRY_TRACE_TOPIC": "on",
             "OTEL_BSP_SCHEDULE_DELAY": "200"}   # export every 200 ms: the test waits for spans
PLAIN = 30          # traced messages to `orders`, no delay
DELAYED = 6         # traced messages to `orders` with DELAY_MS
DELAY_MS = 1500
SLOW_READS = 10     # records the `slow` group reads of `orders` before it stops (lag)
PAY_OK, PAY_ONCE, PAY_POISON = 4, 2, 2   # `pay`: fine, fail once, always fail
MAX_RECONSUME = 2
BACKOFF_MS = 300
SPANS_TIMEOUT_S = 30.0


@dataclass
class Truth:
    """What the test sent and saw, per message id."""

    orders: str
    pay: str
    fast: str
    slow: str
    retry: str
    sent_ns: dict[str, int] = field(default_factory=dict)
    done_ns: dict[str, int] = field(default_factory=dict)   # last handler end (fast / retry)
    delayed: set[str] = field(default_factory=set)
    kind: dict[str, str] = field(default_factory=dict)      # pay: ok / once / poison
    slow_read: int = 0


@contextmanager
def traced_env(traces: Path) -> Iterator[None]:
    """TRACE_ENV + FERRY_TRACE_DIR for this process and the ones it starts."""
    env = {**TRACE_ENV, "FERRY_TRACE_DIR": str(traces)}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    tracing().shutdown()   # the process's trace-topic target becomes this mesh's namesrv
    try:
        yield
    finally:
        tracing().shutdown()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def start_traced_mesh(etcd: Etcd, workdir: Path) -> tuple[Mesh, SchedulerProc]:
    mesh = Mesh(etcd, workdir)
    try:
        mesh.start_namesrv()
        mesh.broker_env = {"FERRY_BROKER_NAMESRV": mesh.namesrv}
        mesh.start_broker("broker-a")
        return mesh, start_scheduler(mesh, "sched-report")
    except BaseException:
        mesh.stop()
        raise


async def _run_group(mesh: Mesh, topic: str, group: str, handler: Any, done: asyncio.Event,
                     **opts: Any) -> None:
    async with Consumer(topic, group=group, namesrv=mesh.namesrv, **{**FAST, **opts}) as c:
        task = asyncio.ensure_future(c.run(handler))
        try:
            await asyncio.wait_for(done.wait(), 60)
            await asyncio.sleep(0.5)   # let the last send-back / commit settle
        finally:
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass


async def _slow_reader(mesh: Mesh, truth: Truth) -> None:
    """Reads about SLOW_READS records of `orders`, commits them, and stops: a lagging group."""
    async with Consumer(truth.orders, group=truth.slow, namesrv=mesh.namesrv,
                        auto_offset_reset="earliest", **FAST) as consumer:
        deadline = time.monotonic() + 30
        while truth.slow_read < SLOW_READS and time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=300,
                                           max_records=SLOW_READS - truth.slow_read)
            truth.slow_read += sum(len(v) for v in batch.values())
    # stop() committed what was read


def _fast_handler(truth: Truth, done: asyncio.Event) -> Any:
    seen: set[str] = set()

    async def handle(rec: ConsumerRecord) -> None:
        truth.done_ns[rec.msg_id] = time.time_ns()
        seen.add(rec.msg_id)
        if len(seen) >= PLAIN + DELAYED:
            done.set()
    return handle


def _pay_handler(truth: Truth, done: asyncio.Event, calls: list[str]) -> Any:
    want = PAY_OK + PAY_ONCE * 2 + PAY_POISON * (MAX_RECONSUME + 1)

    async def handle(rec: ConsumerRecord) -> None:
        calls.append(rec.msg_id)
        truth.done_ns[rec.msg_id] = time.time_ns()
        if len(calls) >= want:
            done.set()
        kind = rec.body.decode().rsplit("-", 1)[1]   # the handler may run before send returns
        if kind == "poison" or (kind == "once" and rec.reconsume_times == 0):
            raise RuntimeError(f"{kind} fails")
    return handle


async def _send(mesh: Mesh, truth: Truth) -> None:
    async with Producer(namesrv=mesh.namesrv) as producer:
        for i in range(PLAIN + DELAYED):
            delayed = i >= PLAIN
            t0 = time.time_ns()
            sent = await producer.send_and_wait(truth.orders, f"order-{i}".encode(),
                                                key=f"o{i}", trace=True,
                                                delay_ms=DELAY_MS if delayed else None)
            truth.sent_ns[sent.msg_id], truth.kind[sent.msg_id] = t0, "orders"
            if delayed:
                truth.delayed.add(sent.msg_id)
        kinds = ["ok"] * PAY_OK + ["once"] * PAY_ONCE + ["poison"] * PAY_POISON
        for i, kind in enumerate(kinds):
            t0 = time.time_ns()
            sent = await producer.send_and_wait(truth.pay, f"pay{i}-{kind}".encode(), trace=True)
            truth.sent_ns[sent.msg_id], truth.kind[sent.msg_id] = t0, kind


async def run_scenario(mesh: Mesh) -> Truth:
    """Consumers first (so latency is the pipeline's, not a queue's), then the sends."""
    truth = Truth(unique("orders"), unique("pay"), unique("fast"), unique("slow"),
                  unique("retry"))
    async with Admin(namesrv=mesh.namesrv) as admin:
        for topic in (truth.orders, truth.pay):
            await admin.create_topic(topic, queues=4)
        await admin.create_group(truth.retry, retry_max=MAX_RECONSUME,
                                 retry_backoff_ms=[BACKOFF_MS], consume_from="earliest")
    fast_done, pay_done = asyncio.Event(), asyncio.Event()
    pay_calls: list[str] = []
    groups = [
        asyncio.ensure_future(_run_group(mesh, truth.orders, truth.fast,
                                         _fast_handler(truth, fast_done), fast_done,
                                         auto_offset_reset="earliest")),
        asyncio.ensure_future(_run_group(mesh, truth.pay, truth.retry,
                                         _pay_handler(truth, pay_done, pay_calls), pay_done)),
    ]
    await asyncio.sleep(1.5)   # the members take their queues
    await _send(mesh, truth)
    await asyncio.gather(*groups)
    await _slow_reader(mesh, truth)
    return truth


def wait_for_spans(traces: Path, truth: Truth) -> None:
    """Until every process has written the spans of every message (they export every 200 ms)."""
    tracing().force_flush()
    want_store = PLAIN + 2 * DELAYED + PAY_OK + PAY_ONCE + PAY_POISON
    deadline = time.monotonic() + SPANS_TIMEOUT_S
    while time.monotonic() < deadline:
        spans = read_trace_dir(traces) if traces.exists() else []
        hops = [s["attributes"].get("ferry.hop") for s in spans
                if s["attributes"].get("messaging.message.id") in truth.sent_ns]
        if hops.count("store") >= want_store and hops.count("deliver") >= DELAYED:
            return
        time.sleep(0.3)
    raise AssertionError(f"spans not all written: {sorted(set(hops))}")
