"""Client spans against a real mesh: producer send (single and batch), consumer receive and
process, retry on nack; read back from the JSON-lines files and from the `%TRACE%` topic."""
from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from ferry import TransactionProducer, TxnState
from ferry.client import Admin, Consumer, ConsumerRecord, Message, Producer
from ferry.client.admin.trace_query import spans_of_message
from ferry.codec import TRACEPARENT
from ferry.telemetry import read_trace_dir, tracing

from tests.client.conftest import Mesh, mesh, unique  # noqa: F401 - `mesh` is a fixture
from tests.client.util import FAST, collect

pytestmark = pytest.mark.integration


@pytest.fixture
def trace_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Tracing on, sampling off (only forced messages), spans to JSON lines under tmp_path."""
    directory = tmp_path / "traces"
    monkeypatch.setenv("FERRY_TRACING", "on")
    monkeypatch.setenv("FERRY_TRACE_SAMPLE_RATIO", "0")
    monkeypatch.setenv("FERRY_TRACE_DIR", str(directory))
    monkeypatch.setenv("FERRY_TRACE_TOPIC", "on")
    # A fresh start: the trace topic's target is the first namesrv after a shutdown (this mesh's).
    tracing().shutdown()
    yield directory
    tracing().shutdown()


def _spans(directory: Path, msg_id: str) -> list[dict[str, Any]]:
    tracing().force_flush()
    return [s for s in read_trace_dir(directory)
            if s["attributes"].get("messaging.message.id") == msg_id]


async def test_a_forced_trace_follows_send_receive_process_retry(mesh: Mesh,  # noqa: F811
                                                                  trace_dir: Path) -> None:
    topic, group = unique("traced"), unique("g")
    async with Admin(namesrv=mesh.namesrv) as admin:
        await admin.create_group(group, retry_backoff_ms=[0], consume_from="earliest")
    async with Producer(namesrv=mesh.namesrv) as producer:
        traced = await producer.send_and_wait(topic, b"pay", key="o-1", trace=True)
        plain = await producer.send_and_wait(topic, b"other")
    done = asyncio.Event()
    seen: list[ConsumerRecord] = []

    async def handler(rec: ConsumerRecord) -> None:
        seen.append(rec)
        if rec.msg_id == traced.msg_id and rec.reconsume_times == 0:
            raise RuntimeError("first attempt fails")
        if rec.msg_id == traced.msg_id:
            done.set()

    async with Consumer(topic, group=group, namesrv=mesh.namesrv, **FAST) as consumer:
        task = asyncio.ensure_future(consumer.run(handler))
        await asyncio.wait_for(done.wait(), 30)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert TRACEPARENT not in next(r for r in seen if r.msg_id == plain.msg_id).properties

    spans = _spans(trace_dir, traced.msg_id)
    hops = [(s["attributes"]["ferry.hop"], s["attributes"].get("ferry.outcome")) for s in spans]
    assert hops == [("send", "ok"), ("receive", None), ("process", "failed"),
                    ("retry", "retry"), ("receive", None), ("process", "ok")]
    assert len({s["trace_id"] for s in spans}) == 1
    send, receive1, process1, retry, receive2, _ = spans
    assert (send["name"], send["kind"]) == (f"send {topic}", "PRODUCER")
    assert send["attributes"]["ferry.queue_offset"] == traced.queue_offset
    assert receive1["parent_span_id"] == send["span_id"] and receive1["kind"] == "CONSUMER"
    assert process1["status"] == "ERROR"
    assert retry["attributes"]["messaging.destination.name"] == f"%RETRY%{group}"
    assert receive2["parent_span_id"] == retry["span_id"]
    assert receive2["attributes"]["ferry.reconsume_times"] == 1
    assert receive1["attributes"]["messaging.consumer.group.name"] == group
    assert _spans(trace_dir, plain.msg_id) == []    # sampling off: the plain one has none

    # The same spans, found by message id through the brokers' %TRACE% topic.
    found: list[dict[str, Any]] = []
    for _ in range(50):
        found = await spans_of_message(mesh.namesrv, traced.msg_id)
        if len(found) >= len(spans):
            break
        await asyncio.sleep(0.2)
    assert {s["span_id"] for s in spans} <= {s["span_id"] for s in found}
    assert [s["start_ns"] for s in found] == sorted(s["start_ns"] for s in found)


async def test_send_batch_traces_each_forced_message_and_links_them(mesh: Mesh,  # noqa: F811
                                                                    trace_dir: Path) -> None:
    topic, group = unique("batch"), unique("g")
    async with Producer(namesrv=mesh.namesrv) as producer:
        results = await producer.send_batch(topic, [Message(b"a", trace=True), Message(b"b"),
                                                    Message(b"c", trace=True)])
    async with Consumer(topic, group=group, namesrv=mesh.namesrv, auto_offset_reset="earliest",
                        **FAST) as consumer:
        got = [r for rs in (await collect([consumer], 3)).values() for r in rs]
    by_id = {r.msg_id: r for r in got}
    assert [TRACEPARENT in by_id[r.msg_id].properties for r in results] == [True, False, True]
    tracing().force_flush()
    spans = read_trace_dir(trace_dir)
    sends = [s for s in spans if s["attributes"].get("ferry.hop") == "send"]
    batch = next(s for s in sends if "messaging.message.id" not in s["attributes"])
    assert batch["attributes"]["messaging.batch.message_count"] == 3
    own = {s["attributes"]["messaging.message.id"]: s for s in sends if s is not batch}
    assert set(own) == {results[0].msg_id, results[2].msg_id}
    assert {(link["trace_id"], link["span_id"]) for link in batch["links"]} == \
        {(s["trace_id"], s["span_id"]) for s in own.values()}
    receives = [s for s in spans if s["attributes"].get("ferry.hop") == "receive"]
    assert {s["parent_span_id"] for s in receives} == {s["span_id"] for s in own.values()}


async def test_sampling_off_and_tracing_off_make_no_span(mesh: Mesh,  # noqa: F811
                                                        trace_dir: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    topic = unique("quiet")
    async with Producer(namesrv=mesh.namesrv) as producer:
        for i in range(20):
            await producer.send_and_wait(topic, b"%d" % i)   # ratio 0: none sampled
    tracing().force_flush()
    assert read_trace_dir(trace_dir) == []
    monkeypatch.setenv("FERRY_TRACING", "off")
    async with Producer(namesrv=mesh.namesrv) as producer:
        assert not tracing().enabled
        sent = await producer.send_and_wait(topic, b"forced", trace=True)
    async with Consumer(topic, group=unique("g"), namesrv=mesh.namesrv,
                        auto_offset_reset="earliest", **FAST) as consumer:
        got = [r for rs in (await collect([consumer], 21)).values() for r in rs]
    assert TRACEPARENT not in next(r for r in got if r.msg_id == sent.msg_id).properties
    assert read_trace_dir(trace_dir) == []


async def test_a_traced_transaction_has_half_and_end_and_its_message_carries_the_trace(
        mesh: Mesh, trace_dir: Path) -> None:  # noqa: F811
    topic = unique("txn")
    async with TransactionProducer(group=unique("tx"), namesrv=mesh.namesrv,
                                   checker=lambda rec: TxnState.UNKNOWN) as tp:
        txn = await tp.begin(topic, b"order", trace=True)
        await txn.commit()
        plain = await tp.begin(topic, b"plain")
        await plain.rollback()
    async with Consumer(topic, group=unique("g"), namesrv=mesh.namesrv,
                        auto_offset_reset="earliest", **FAST) as consumer:
        (record,) = [r for rs in (await collect([consumer], 1)).values() for r in rs]
    assert record.msg_id == txn.msg_id
    spans = _spans(trace_dir, txn.msg_id)
    hops = [(s["attributes"]["ferry.hop"], s["kind"]) for s in spans]
    assert hops[:2] == [("half", "PRODUCER"), ("end", "CLIENT")]
    half, end = spans[:2]
    assert end["parent_span_id"] == half["span_id"]
    assert end["attributes"]["ferry.outcome"] == "commit"
    assert half["trace_id"] in record.properties[TRACEPARENT]
    assert _spans(trace_dir, plain.msg_id) == []
