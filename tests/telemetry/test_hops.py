"""A message's trace across real processes: producer → broker → scheduler → consumer.

One mesh (namesrv, a broker, the delay scheduler) whose processes, like this
test process, trace with sampling off (FERRY_TRACE_SAMPLE_RATIO=0: only
messages sent with `trace=True`), write JSON-lines spans under one directory
and write their spans to the `%TRACE%` topic. A trace is found by message id
both ways: `spans_of_message` (the trace topic) and the JSON-lines files.
"""
from __future__ import annotations

import asyncio
import json
import os
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from ferry.client import (
    Admin,
    Consumer,
    ConsumerRecord,
    Message,
    Producer,
    TransactionProducer,
    TxnState,
)
from ferry.client.admin.trace_query import spans_of_message
from ferry.codec import CHECK_IMMUNITY_MS, TRACEPARENT, MessageFlag, msg_id_hex
from ferry.idempotence import RedisClaim
from ferry.telemetry import read_trace_dir, tracing

from tests.broker.txn_client import TxnClient
from tests.client.conftest import Mesh, unique
from tests.client.util import FAST
from tests.dedup.conftest import start_dedup
from tests.support.procs import Etcd, Redis

sched = pytest.importorskip("tests.delay_scheduler.conftest")
txn = pytest.importorskip("tests.txn_checker.conftest")
TRACED = int(MessageFlag.TRACED)

pytestmark = pytest.mark.integration

#: The environment of every process of the module (this one included).
TRACE_ENV = {"FERRY_TRACE_SAMPLE_RATIO": "0", "FERRY_TRACING": "on", "FERRY_TRACE_TOPIC": "on",
             # Export every 200 ms, not every 5 s: the test waits for the spans.
             "OTEL_BSP_SCHEDULE_DELAY": "200"}
SPANS_TIMEOUT_S = 30.0
DELAY_MS = 1000


@pytest.fixture(scope="module")
def traced_mesh(etcd: Etcd, tmp_path_factory: pytest.TempPathFactory
                ) -> Iterator[tuple[Mesh, Path]]:
    workdir = tmp_path_factory.mktemp("traced-mesh")
    traces = workdir / "traces"
    env = {**TRACE_ENV, "FERRY_TRACE_DIR": str(traces)}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    tracing().shutdown()   # the process's trace-topic target becomes this mesh's namesrv
    mesh = Mesh(etcd, workdir)
    scheduler = None
    try:
        mesh.start_namesrv()
        mesh.broker_env = {"FERRY_BROKER_NAMESRV": mesh.namesrv}
        mesh.start_broker("broker-a")
        scheduler = sched.start_scheduler(mesh, "sched-trace")
        yield mesh, traces
    finally:
        if scheduler is not None:
            scheduler.proc.stop()
        mesh.stop()
        tracing().shutdown()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def label(span: dict[str, Any]) -> str:
    """A span as the hop list names it: the hop, and the outcome of a `process`."""
    attrs = span["attributes"]
    hop = str(attrs.get("ferry.hop"))
    if hop == "process":
        return f"process {attrs.get('ferry.outcome')}"
    return hop


def is_subsequence(want: Sequence[str], got: Sequence[str]) -> bool:
    it = iter(got)
    return all(any(g == w for g in it) for w in want)


def one_trace(spans: list[dict[str, Any]], msg_id: str) -> list[dict[str, Any]]:
    """The spans of the one trace that has a span of `msg_id`, by start time."""
    traces = {s["trace_id"] for s in spans
              if s["attributes"].get("messaging.message.id") == msg_id}
    assert len(traces) == 1, traces
    (trace_id,) = traces
    return sorted((s for s in spans if s["trace_id"] == trace_id), key=lambda s: s["start_ns"])


def jsonl_trace(traces: Path, msg_id: str) -> list[dict[str, Any]]:
    return one_trace(read_trace_dir(traces), msg_id) if traces.exists() else []


async def until_hops(read: Callable[[], Any], want: Sequence[str]) -> list[dict[str, Any]]:
    """Poll `read()` (spans by start time) until `want` is a subsequence of their labels."""
    deadline = time.monotonic() + SPANS_TIMEOUT_S
    spans: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        await asyncio.to_thread(tracing().force_flush)
        try:
            spans = await read()
        except AssertionError:   # no span of the message yet
            spans = []
        if is_subsequence(want, [label(s) for s in spans]):
            return spans
        await asyncio.sleep(0.3)
    raise AssertionError(f"hops {want} not all seen in {[label(s) for s in spans]}")


async def consume(mesh: Mesh, topic: str, group: str, handler: Any, done: asyncio.Event,
                  **opts: Any) -> None:
    async with Consumer(topic, group=group, namesrv=mesh.namesrv, **{**FAST, **opts}) as c:
        task = asyncio.ensure_future(c.run(handler))
        try:
            await asyncio.wait_for(done.wait(), 60)
        finally:
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task


HOPS = ["send", "store", "schedule", "deliver", "receive", "process failed", "retry",
        "receive", "process ok"]


async def test_a_delayed_message_nacked_once_is_one_trace_with_every_hop_in_order(
        traced_mesh: tuple[Mesh, Path]) -> None:
    mesh, traces = traced_mesh
    topic, group = unique("traced"), unique("g")
    async with Admin(namesrv=mesh.namesrv) as admin:
        # Through the scheduler again for the retry (the back-off is a delay too).
        await admin.create_group(group, retry_backoff_ms=[300], consume_from="earliest")
    async with Producer(namesrv=mesh.namesrv) as producer:
        sent = await producer.send_and_wait(topic, b"pay", delay_ms=DELAY_MS, trace=True)
    calls: list[ConsumerRecord] = []
    done = asyncio.Event()

    async def handler(rec: ConsumerRecord) -> None:
        calls.append(rec)
        if len(calls) == 1:
            raise RuntimeError("payment service down")
        done.set()

    await consume(mesh, topic, group, handler, done)
    assert [r.msg_id for r in calls] == [sent.msg_id] * 2

    by_topic = await until_hops(lambda: spans_of_message(mesh.namesrv, sent.msg_id), HOPS)
    trace_ids = {s["trace_id"] for s in by_topic}
    assert len(trace_ids) == 1   # ONE trace, found from the message id
    by_files = await until_hops(lambda: asyncio.to_thread(jsonl_trace, traces, sent.msg_id),
                                HOPS)
    assert {s["trace_id"] for s in by_files} == trace_ids
    # Each service wrote its own hops, with the attributes every span has.
    services = {s["service"] for s in by_files}
    assert {"ferry-broker", "ferry-delay-scheduler"} <= services
    for s in by_files:
        assert s["attributes"]["messaging.system"] == "ferry"
    store = next(s for s in by_files if label(s) == "store")
    assert store["attributes"]["ferry.broker"] == "broker-a"
    assert "ferry.queue_offset" in store["attributes"]
    failed = next(s for s in by_files if label(s) == "process failed")
    assert failed["status"] == "ERROR"


async def test_context_survives_send_batch(traced_mesh: tuple[Mesh, Path]) -> None:
    mesh, traces = traced_mesh
    topic, group = unique("batch"), unique("g")
    async with Producer(namesrv=mesh.namesrv) as producer:
        results = await producer.send_batch(topic, [
            Message(b"a", trace=True), Message(b"b"), Message(b"c", trace=True)])
    done = asyncio.Event()
    seen: list[str] = []

    async def handler(rec: ConsumerRecord) -> None:
        seen.append(rec.msg_id)
        if len(seen) == 3:
            done.set()

    await consume(mesh, topic, group, handler, done, auto_offset_reset="earliest")
    for traced in (results[0], results[2]):
        spans = await until_hops(
            lambda m=traced.msg_id: spans_of_message(mesh.namesrv, m),
            ["send", "store", "receive", "process ok"])
        assert len({s["trace_id"] for s in spans}) == 1
    # The untraced message of the batch has no span anywhere.
    await asyncio.to_thread(tracing().force_flush)
    await asyncio.sleep(1)
    assert not [s for s in read_trace_dir(traces)
                if s["attributes"].get("messaging.message.id") == results[1].msg_id]


async def test_with_sampling_off_an_unforced_message_makes_no_span(
        traced_mesh: tuple[Mesh, Path]) -> None:
    mesh, traces = traced_mesh
    topic, group = unique("plain"), unique("g")
    async with Admin(namesrv=mesh.namesrv) as admin:
        await admin.create_group(group, retry_backoff_ms=[300], consume_from="earliest")
    async with Producer(namesrv=mesh.namesrv) as producer:
        sent = await producer.send_and_wait(topic, b"quiet", delay_ms=DELAY_MS)
    calls: list[str] = []
    done = asyncio.Event()

    async def handler(rec: ConsumerRecord) -> None:
        calls.append(rec.msg_id)
        if len(calls) == 1:
            raise RuntimeError("nack once")
        done.set()

    await consume(mesh, topic, group, handler, done)
    # A forced message sent after it shows the exporters are working meanwhile.
    async with Producer(namesrv=mesh.namesrv) as producer:
        marker = await producer.send_and_wait(topic, b"marker", trace=True)
    await until_hops(lambda: asyncio.to_thread(jsonl_trace, traces, marker.msg_id),
                     ["send", "store"])
    every = read_trace_dir(traces)
    assert not [s for s in every if s["attributes"].get("messaging.message.id") == sent.msg_id]
    assert await spans_of_message(mesh.namesrv, sent.msg_id) == []
    assert not any(sent.msg_id in json.dumps(s) for s in every)


async def test_a_traced_half_left_open_is_checked_under_a_check_span(
        traced_mesh: tuple[Mesh, Path]) -> None:
    mesh, _ = traced_mesh
    topic = unique("txn")
    checker = txn.start_txn_checker(mesh, unique("checker"), env={
        "FERRY_TXN_CHECKER_CHECK_INTERVAL_MS": "500", "FERRY_TXN_CHECKER_MAX_CHECKS": "1"})
    try:
        async with Producer(namesrv=mesh.namesrv) as producer:
            await producer.send_and_wait(topic, b"route")   # the topic exists on the broker
        client = await TxnClient.connect("127.0.0.1", mesh.brokers["broker-a"].port)
        try:
            async with Producer(namesrv=mesh.namesrv) as producer:   # a traced context
                parent = await producer.send_and_wait(topic, b"parent", trace=True)
            parent_spans = await until_hops(
                lambda: spans_of_message(mesh.namesrv, parent.msg_id), ["send", "store"])
            traceparent = (f"00-{parent_spans[0]['trace_id']}-{parent_spans[0]['span_id']}-01")
            half = await client.begin(topic, 0, b"order", unique("g"), flags=TRACED,
                                      **{TRACEPARENT: traceparent, CHECK_IMMUNITY_MS: "0"})
        finally:
            await client.close()
        # Nobody answers: checked once (no producer), then discarded (rolled back).
        spans = await until_hops(lambda: spans_of_message(mesh.namesrv, msg_id_hex(half.msg_id)),
                                 ["half", "check", "check", "end"])
    finally:
        checker.proc.stop()
    checks = [s for s in spans if label(s) == "check"]
    assert {s["service"] for s in checks} == {"ferry-txn-checker"}
    assert [s["attributes"]["ferry.outcome"] for s in checks][:2] == ["no_producer", "discarded"]
    assert {s["trace_id"] for s in spans} == {parent_spans[0]["trace_id"]}


async def test_the_dedup_check_of_a_traced_record_is_a_dedup_span(
        traced_mesh: tuple[Mesh, Path], redis_server: Redis) -> None:
    mesh, traces = traced_mesh
    topic, group = unique("idem"), unique("g")
    async with Producer(namesrv=mesh.namesrv) as producer:
        sent = await producer.send_and_wait(topic, b"once", key="order-7", trace=True)
    done = asyncio.Event()

    async def handler(rec: ConsumerRecord) -> None:
        done.set()

    claim = RedisClaim(redis_server.url, scene=unique("scene"))
    async with Consumer(topic, group=group, namesrv=mesh.namesrv, auto_offset_reset="earliest",
                        **FAST) as c:
        task = asyncio.ensure_future(c.run(handler, idempotence=claim))
        try:
            await asyncio.wait_for(done.wait(), 60)
            while not (c.idempotence_stats and c.idempotence_stats.ran):  # claim confirmed
                await asyncio.sleep(0.05)
        finally:
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await claim.aclose()
    spans = await until_hops(lambda: spans_of_message(mesh.namesrv, sent.msg_id),
                             ["send", "store", "receive", "process ok", "dedup"])
    dedup = next(s for s in spans if label(s) == "dedup")
    process = next(s for s in spans if label(s) == "process ok")
    assert dedup["parent_span_id"] == process["span_id"]
    assert dedup["attributes"]["ferry.outcome"] == "ok"
    assert dedup["attributes"]["ferry.dedup.check"] == "RedisClaim"


def test_a_claim_request_with_traceparent_is_a_dedup_span_at_the_service(
        traced_mesh: tuple[Mesh, Path], redis_server: Redis, tmp_path: Path) -> None:
    mesh, traces = traced_mesh
    dedup = start_dedup(mesh, redis_server.url, tmp_path / "dedup")
    trace_id, parent_id = "5bf92f3577b34da6a3ce929d0e0e4737", "10f067aa0ba902b7"
    try:
        for headers in ({"traceparent": f"00-{trace_id}-{parent_id}-01"}, {}):
            req = urllib.request.Request(
                f"http://{dedup.addr}/v1/claims", method="POST",
                data=json.dumps({"scene": "pay", "biz_key": unique("k")}).encode(),
                headers={"Content-Type": "application/json", **headers})
            with urllib.request.urlopen(req, timeout=10) as resp:
                assert json.loads(resp.read())["state"] == "claimed"
    finally:
        dedup.proc.stop()   # flushes its spans
    spans = [s for s in read_trace_dir(traces) if s["service"] == "ferry-dedup"]
    assert len(spans) == 1   # the request without the header made none
    (span,) = spans
    assert (span["trace_id"], span["parent_span_id"]) == (trace_id, parent_id)
    assert span["attributes"]["ferry.hop"] == "dedup"
    assert span["attributes"]["ferry.outcome"] == "claimed"
    assert span["kind"] == "SERVER"


async def test_context_survives_a_transaction(traced_mesh: tuple[Mesh, Path]) -> None:
    mesh, _ = traced_mesh
    topic, group = unique("txn-ok"), unique("g")

    def checker(_record: Any) -> TxnState:
        return TxnState.UNKNOWN

    async with TransactionProducer(group=unique("tx"), namesrv=mesh.namesrv,
                                   checker=checker) as producer:
        txn_ = await producer.begin(topic, b"order", trace=True)
        await txn_.commit()
    done = asyncio.Event()

    async def handler(rec: ConsumerRecord) -> None:
        done.set()

    await consume(mesh, topic, group, handler, done, auto_offset_reset="earliest")
    spans = await until_hops(lambda: spans_of_message(mesh.namesrv, txn_.msg_id),
                             ["half", "half", "end", "end", "store", "receive", "process ok"])
    assert len({s["trace_id"] for s in spans}) == 1
    at_broker = {label(s) for s in spans if s["service"] == "ferry-broker"}
    assert {"half", "end", "store"} <= at_broker
    end = next(s for s in spans if label(s) == "end" and s["service"] == "ferry-broker")
    assert end["attributes"]["ferry.outcome"] == "commit"
