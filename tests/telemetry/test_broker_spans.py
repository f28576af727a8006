"""The broker's spans of traced messages (a real broker process, raw wire requests).

A message carrying `MessageFlag.TRACED` and a `TRACEPARENT` gets a `store`
span child of that context, with the broker, queue and offset, on the fast
path (a SEND announcing only TRACED) and on the decoded path (a delayed
message, stored in `%SCHEDULE%`); SEND_BACK of a traced message makes a
`retry` span and the copy keeps the context it came with; a traced
transaction's half is a `half` span, its END an `end` span, and the committed
message's store continues the same trace. Untraced messages make no span.
"""
from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from ferry.codec import (
    DELIVER_AT_MS,
    TRACEPARENT,
    MessageFlag,
    decode_properties,
    iter_records,
    msg_id_hex,
)
from ferry.names import SCHEDULE_TOPIC, dlq_topic, retry_topic
from ferry.telemetry import read_trace_dir
from ferry.wire import RequestCode, WireMessage, encode_messages

from tests.broker.conftest import Broker, start_broker
from tests.broker.txn_client import TxnClient
from tests.broker.wire_client import message
from tests.support.procs import Etcd

TRACED = int(MessageFlag.TRACED)
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
PARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"


@pytest.fixture
def traced_broker(tmp_path: Path, etcd: Etcd) -> Iterator[tuple[Broker, Path]]:
    """A broker of its own per test: the test stops it to flush its spans."""
    workdir = tmp_path
    traces = workdir / "traces"
    broker = start_broker(workdir, etcd, FERRY_TRACE_DIR=str(traces), FERRY_TRACE_TOPIC="off")
    yield broker, traces
    broker.proc.stop()


def _traced(body: bytes, **props: str) -> WireMessage:
    msg = message(body, properties={TRACEPARENT: PARENT, **props})
    msg.flags |= TRACED
    return msg


def _spans_after_stop(broker: Broker, traces: Path) -> list[dict]:
    broker.proc.stop()  # a clean stop flushes the exporters
    return read_trace_dir(traces)


async def test_store_retry_spans_of_traced_messages_only(
        traced_broker: tuple[Broker, Path]) -> None:
    broker, traces = traced_broker
    client = await broker.client()
    try:
        plain = message(b"plain")
        fast = _traced(b"fast")
        # Fast path: the frame announces only TRACED.
        resp = await client.call(RequestCode.SEND, {"topic": "tr-fast", "queue_id": 0,
                                                     "flags": TRACED},
                                 encode_messages([plain, fast]))
        fast_offset = resp.fields["queue_offset"] + 1
        # Decoded path: a delayed traced message goes to %SCHEDULE%.
        delayed = _traced(b"later", **{DELIVER_AT_MS: str(int(time.time() * 1000) + 600_000)})
        delayed.flags |= int(MessageFlag.DELAY)
        await client.call(RequestCode.SEND, {"topic": "tr-delay", "queue_id": 0,
                                              "flags": delayed.flags}, encode_messages([delayed]))
        # SEND_BACK of the fast one, at once (no back-off): %RETRY%<group>.
        # The request names the stored message and carries the consumer's span context.
        ref = {"group": "g-trace", "topic": "tr-fast", "queue_id": 0,
               "queue_offset": fast_offset, "msg_id": fast.msg_id, "traceparent": PARENT}
        resp = await client.call(RequestCode.SEND_BACK, {
            **ref, "reconsume_times": 1, "max_reconsume_times": 16, "delay_ms": 0})
        assert resp.fields["target"] == retry_topic("g-trace")
        # Past max_reconsume_times: the dead-letter topic, a `dlq` span.
        resp = await client.call(RequestCode.SEND_BACK, {
            **ref, "reconsume_times": 17, "max_reconsume_times": 16, "delay_ms": 0})
        assert resp.fields["target"] == dlq_topic("g-trace")
        pulled = await client.call(RequestCode.PULL, {
            "group": "g-trace", "topic": retry_topic("g-trace"), "queue_id": 0, "offset": 0,
            "max_count": 8, "max_wait_ms": 0, "tags": None, "sql": None})
        copies = [r for r in iter_records(pulled.body) if r.msg_id == fast.msg_id]
    finally:
        await client.close()
    spans = _spans_after_stop(broker, traces)
    by_hop: dict[str, list[dict]] = {}
    for s in spans:
        by_hop.setdefault(s["attributes"]["ferry.hop"], []).append(s)

    ids = {s["attributes"].get("messaging.message.id") for s in spans}
    assert msg_id_hex(plain.msg_id) not in ids  # untraced: no span
    stores = {(s["attributes"]["messaging.destination.name"],
               s["attributes"]["messaging.message.id"]): s for s in by_hop["store"]}
    st = stores[("tr-fast", msg_id_hex(fast.msg_id))]
    assert st["trace_id"] == TRACE_ID and st["parent_span_id"] == PARENT_ID
    assert st["kind"] == "SERVER"
    assert st["attributes"]["ferry.broker"] == "broker-a"
    assert st["attributes"]["messaging.destination.partition.id"] == "0"
    assert st["attributes"]["ferry.queue_offset"] == fast_offset
    assert (SCHEDULE_TOPIC, msg_id_hex(delayed.msg_id)) in stores

    (retry,) = by_hop["retry"]
    assert retry["trace_id"] == TRACE_ID and retry["parent_span_id"] == PARENT_ID
    assert retry["attributes"]["messaging.consumer.group.name"] == "g-trace"
    # The copy is TRACED and keeps the context it came with (the consumer's retry span).
    (dead,) = by_hop["dlq"]
    assert dead["attributes"]["ferry.outcome"] == "dead_letter"
    assert dead["attributes"]["messaging.destination.name"] == dlq_topic("g-trace")
    assert dead["parent_span_id"] == PARENT_ID
    (copy,) = copies
    assert copy.flags & TRACED
    assert decode_properties(copy.properties_raw)[TRACEPARENT] == PARENT
    copy_store = stores[(retry_topic("g-trace"), msg_id_hex(fast.msg_id))]
    assert copy_store["parent_span_id"] == PARENT_ID


async def test_a_traced_transaction_is_half_end_and_store_in_one_trace(
        traced_broker: tuple[Broker, Path]) -> None:
    broker, traces = traced_broker
    client = await TxnClient.connect("127.0.0.1", broker.port)
    try:
        half = await client.begin("tr-txn", 0, b"order", "g-txn", flags=TRACED,
                                  **{TRACEPARENT: PARENT})
        untraced = await client.begin("tr-txn", 0, b"other", "g-txn")
        await client.end("g-txn", half.msg_id, "commit")
        await client.end("g-txn", untraced.msg_id, "rollback")
    finally:
        await client.close()
    spans = _spans_after_stop(broker, traces)
    mine = [s for s in spans if s["attributes"].get("messaging.message.id")
            == msg_id_hex(half.msg_id)]
    hops = {s["attributes"]["ferry.hop"]: s for s in mine}
    assert set(hops) == {"half", "end", "store"}
    assert all(s["trace_id"] == TRACE_ID for s in mine)
    assert hops["half"]["kind"] == "SERVER" and hops["end"]["kind"] == "SERVER"
    assert hops["half"]["attributes"]["messaging.destination.name"] == "%HALF%"
    assert hops["end"]["attributes"]["ferry.outcome"] == "commit"
    assert hops["store"]["attributes"]["messaging.destination.name"] == "tr-txn"
    assert not [s for s in spans if s["attributes"].get("messaging.message.id")
                == msg_id_hex(untraced.msg_id)]


async def test_with_tracing_off_a_traced_message_makes_no_span(tmp_path: Path,
                                                               etcd: Etcd) -> None:
    traces = tmp_path / "traces"
    broker = start_broker(tmp_path, etcd, FERRY_TRACE_DIR=str(traces), FERRY_TRACE_TOPIC="off",
                          FERRY_TRACING="off")
    try:
        client = await broker.client()
        try:
            msg = _traced(b"x")
            sent = await client.call(RequestCode.SEND, {"topic": "tr-off", "queue_id": 0,
                                                         "flags": TRACED},
                                     encode_messages([msg]))
            await client.call(RequestCode.SEND_BACK, {
                "group": "g-off", "topic": "tr-off", "queue_id": 0,
                "queue_offset": sent.fields["queue_offset"], "msg_id": msg.msg_id,
                "traceparent": PARENT, "reconsume_times": 1, "max_reconsume_times": 16,
                "delay_ms": 0})
        finally:
            await client.close()
        spans = _spans_after_stop(broker, traces)
    finally:
        broker.proc.stop()
    assert spans == []
