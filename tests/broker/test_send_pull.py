"""SEND and PULL against a real broker process over real TCP."""
from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from ferry.errors import MalformedRequestError
from ferry.store import tag_hash
from ferry.wire import RequestCode, encode_messages

from tests.broker.conftest import Broker, start_broker
from tests.broker.wire_client import WireClient, message
from tests.support.procs import Etcd

pytestmark = pytest.mark.integration


async def test_send_then_pull_round_trip(client: WireClient) -> None:
    sent = message(b"hello", tags="created", keys="order-1 cust-9")
    ack = await client.send("rt", 2, [sent])
    assert ack["queue_id"] == 2 and ack["queue_offset"] == 0 and ack["count"] == 1
    assert ack["phy_offset"] >= 0
    fields, msgs = await client.pull("rt", 2, 0)
    assert fields["status"] == "FOUND" and fields["next_offset"] == 1
    assert fields["min_offset"] == 0 and fields["max_offset"] == 1
    [got] = msgs
    assert (got.body, got.tags, got.keys, got.msg_id) == (b"hello", "created", "order-1 cust-9",
                                                           sent.msg_id)
    assert got.topic == "rt" and got.queue_id == 2 and got.queue_offset == 0
    assert got.born_host.startswith("127.0.0.1:")


async def test_batch_is_stored_in_order(client: WireClient) -> None:
    batch = [message(f"m{i}".encode()) for i in range(100)]
    ack = await client.send("batch", 0, batch)
    assert ack["count"] == 100 and ack["queue_offset"] == 0
    ack2 = await client.send("batch", 0, batch[:10])
    assert ack2["queue_offset"] == 100
    fields, msgs = await client.pull("batch", 0, 0, max_count=200)
    assert [m.body for m in msgs][:100] == [m.body for m in batch]
    assert [m.queue_offset for m in msgs] == list(range(110))
    assert fields["next_offset"] == 110


async def test_oneway_send_gets_no_response_but_is_stored(client: WireClient) -> None:
    client.oneway(RequestCode.SEND, {"topic": "oneway", "queue_id": 0},
                  encode_messages([message(b"fire-and-forget")]))
    fields, msgs = await client.pull("oneway", 0, 0, max_wait_ms=2000)
    assert [m.body for m in msgs] == [b"fire-and-forget"]
    assert not client.pending  # nothing came back for the one-way request


async def test_long_poll_answers_soon_after_a_send(broker: Broker) -> None:
    consumer, producer = await broker.client(), await broker.client()
    try:
        pull = asyncio.create_task(consumer.pull("lp", 1, 0, max_wait_ms=10_000))
        await asyncio.sleep(0.3)  # the pull is parked at the broker by now
        assert not pull.done()
        started = time.monotonic()
        await producer.send("lp", 1, [message(b"wake")])
        fields, msgs = await pull
        elapsed_ms = (time.monotonic() - started) * 1000
        assert [m.body for m in msgs] == [b"wake"]
        assert elapsed_ms < 50, f"long poll answered {elapsed_ms:.1f} ms after the send"
    finally:
        await consumer.close()
        await producer.close()


async def test_long_poll_times_out_empty(client: WireClient) -> None:
    started = time.monotonic()
    fields, msgs = await client.pull("lp-empty", 0, 0, max_wait_ms=300)
    assert msgs == [] and fields["status"] in ("NO_MESSAGE_IN_QUEUE", "OFFSET_OVERFLOW_ONE")
    assert 0.25 < time.monotonic() - started < 3


async def test_tag_filter_skips_other_tags_and_long_polls(client: WireClient) -> None:
    await client.send("tags", 0, [message(b"a", tags="A"), message(b"b", tags="B"),
                                  message(b"c", tags="C")])
    fields, msgs = await client.pull("tags", 0, 0, tags=["A", "C"])
    assert [m.body for m in msgs] == [b"a", b"c"] and fields["next_offset"] == 3
    assert all(m.tag_hash in (tag_hash("A"), tag_hash("C")) for m in msgs)
    # Nothing matching yet: a B arrives (skipped), then a C answers the parked pull.
    pull = asyncio.create_task(client.pull("tags", 0, 3, tags=["C"], max_wait_ms=5000))
    await asyncio.sleep(0.2)
    await client.send("tags", 0, [message(b"b2", tags="B")])
    await asyncio.sleep(0.2)
    assert not pull.done()
    await client.send("tags", 0, [message(b"c2", tags="C")])
    fields, msgs = await asyncio.wait_for(pull, 2)
    assert [m.body for m in msgs] == [b"c2"] and fields["next_offset"] == 5
    _, every = await client.pull("tags", 0, 0, tags="*")
    assert len(every) == 5


async def test_offset_out_of_range_reports_next_offset(client: WireClient) -> None:
    await client.send("range", 0, [message(b"x")] * 3)
    fields, msgs = await client.pull("range", 0, 10)
    # Without a history the broker cannot tell what the consumer saw: it sends it to the
    # oldest stored record, never past stored records.
    assert msgs == [] and fields["status"] == "OFFSET_OVERFLOW_BADLY"
    assert fields["max_offset"] == 3 and fields["next_offset"] == 0
    # With the history of its last record, past the end of the queue's open history:
    # this broker has not caught up with the reader (a slave behind); it stays there.
    fields, msgs = await client.pull("range", 0, 3)
    hist = fields["hist"]
    fields, msgs = await client.pull("range", 0, 10, hist=hist)
    assert msgs == [] and fields["status"] == "OFFSET_OVERFLOW_ONE"
    assert fields["next_offset"] == 10
    fields, msgs = await client.pull("range", 0, 10, hist="L0123456789abcdef")   # unknown
    assert fields["status"] == "HISTORY_DIVERGED" and fields["next_offset"] == 0
    assert "hist" not in fields
    fields, msgs = await client.pull("range", 0, 1, hist=hist)   # within it: served
    assert fields["status"] == "FOUND" and len(msgs) == 2 and fields["hist"] == hist


async def test_pull_rejects_bad_fields(client: WireClient) -> None:
    with pytest.raises(MalformedRequestError, match="offset"):
        await client.call(RequestCode.PULL, {"group": "g", "topic": "t", "queue_id": 0,
                                             "offset": "zero"})
    with pytest.raises(MalformedRequestError, match="queue_id"):
        await client.send("t", 8, [message(b"x")])  # topics get 8 queues by default
    for bad in (5, "", "L" * 33):
        with pytest.raises(MalformedRequestError, match="hist"):
            await client.pull("t", 0, 0, hist=bad)  # type: ignore[arg-type]


async def test_sync_flush_mode_acknowledges(tmp_path: Path, etcd: Etcd) -> None:
    b = start_broker(tmp_path, etcd, FERRY_BROKER_FLUSH_MODE="sync")
    try:
        c = await b.client()
        acks = await asyncio.gather(*(c.send("sync", i % 4, [message(b"durable")])
                                      for i in range(40)))
        assert sum(a["count"] for a in acks) == 40
        assert b.get_json("/v1/stats")["broker"]["flush_mode"] == "sync"
        await c.close()
    finally:
        b.proc.stop()
    assert "Traceback" not in b.proc.log()
