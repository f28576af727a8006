"""Consumer offsets (and their file across a restart), queue bounds, time lookup, queries."""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from ferry.errors import (
    InvalidNameError,
    MalformedRequestError,
    MessageNotFoundError,
    TopicNotFoundError,
)
from ferry.store import iter_records
from ferry.wire import RequestCode

from tests.broker.conftest import start_broker
from tests.broker.wire_client import WireClient, message
from tests.support.procs import Etcd

pytestmark = pytest.mark.integration


async def test_commit_and_query_offset(client: WireClient) -> None:
    q = {"group": "g1", "topic": "offs", "queue_id": 3}
    with pytest.raises(TopicNotFoundError):   # no such topic yet: nothing to commit for
        await client.call(RequestCode.COMMIT_OFFSET, {**q, "offset": 0})
    await client.send("offs", 3, [message(b"x")] * 50)
    assert (await client.call(RequestCode.QUERY_OFFSET, q)).fields["offset"] == -1
    await client.call(RequestCode.COMMIT_OFFSET, {**q, "offset": 42})
    assert (await client.call(RequestCode.QUERY_OFFSET, q)).fields["offset"] == 42
    # Past the queue's end (50): lowered to it, never a skip of what is written next.
    await client.call(RequestCode.COMMIT_OFFSET, {**q, "offset": 90})
    assert (await client.call(RequestCode.QUERY_OFFSET, q)).fields["offset"] == 50
    with pytest.raises(TopicNotFoundError):   # the topic has 8 queues here (DEFAULT_QUEUES)
        await client.call(RequestCode.COMMIT_OFFSET, {**q, "queue_id": 8, "offset": 0})
    with pytest.raises(MalformedRequestError):
        await client.call(RequestCode.COMMIT_OFFSET, {**q, "offset": -1})
    with pytest.raises(InvalidNameError):
        await client.call(RequestCode.COMMIT_OFFSET, {**q, "group": "bad group", "offset": 1})


async def test_offsets_persist_across_restart(tmp_path: Path, etcd: Etcd) -> None:
    b = start_broker(tmp_path / "one", etcd, data_dir=tmp_path / "data")
    c = await b.client()
    await c.send("persist", 0, [message(b"x")] * 5)
    await c.send("persist", 1, [message(b"x")] * 7)
    for qid, offset in ((0, 5), (1, 7)):
        await c.call(RequestCode.COMMIT_OFFSET,
                     {"group": "pg", "topic": "persist", "queue_id": qid, "offset": offset})
    await c.close()
    b.proc.stop()  # SIGTERM: offsets are saved at stop, well before the 5 s interval
    assert b.proc.popen.returncode == 0, b.proc.log()[-2000:]
    doc = json.loads((tmp_path / "data" / "config" / "consumer_offsets.json").read_text())
    assert doc["offsets"]["pg"]["persist"] == {"0": 5, "1": 7}

    b2 = start_broker(tmp_path / "two", etcd, data_dir=tmp_path / "data")
    try:
        c2 = await b2.client()
        got = await c2.call(RequestCode.QUERY_OFFSET,
                            {"group": "pg", "topic": "persist", "queue_id": 1})
        assert got.fields["offset"] == 7
        _, msgs = await c2.pull("persist", 0, 0)
        assert len(msgs) == 5  # the messages survived the clean restart as well
        stats = b2.get_json("/v1/stats")
        assert stats["groups"]["pg"]["persist"]["0"] == {
            "committed_offset": 5, "max_offset": 5, "lag": 0}
        assert stats["groups"]["pg"]["persist"]["1"]["lag"] == 0
        assert stats["topics"]["persist"]["0"] == {"min_offset": 0, "max_offset": 5}
        await c2.close()
    finally:
        b2.proc.stop()


async def test_min_max_and_offset_for_time(client: WireClient) -> None:
    mm = await client.call(RequestCode.GET_MIN_MAX, {"topic": "times", "queue_id": 0})
    assert mm.fields == {"min_offset": 0, "max_offset": 0}
    await client.send("times", 0, [message(b"early")] * 3)
    time.sleep(0.05)
    middle_ms = int(time.time() * 1000)
    time.sleep(0.05)
    await client.send("times", 0, [message(b"late")] * 2)
    mm = await client.call(RequestCode.GET_MIN_MAX, {"topic": "times", "queue_id": 0})
    assert mm.fields == {"min_offset": 0, "max_offset": 5}
    got = await client.call(RequestCode.OFFSET_FOR_TIME,
                            {"topic": "times", "queue_id": 0, "ts_ms": middle_ms})
    assert got.fields["offset"] == 3
    got = await client.call(RequestCode.OFFSET_FOR_TIME,
                            {"topic": "times", "queue_id": 0, "ts_ms": 0})
    assert got.fields["offset"] == 0


async def test_query_by_id_and_key(client: WireClient) -> None:
    a, b = message(b"A", keys="k1 shared"), message(b"B", keys="k2 shared")
    await client.send("query", 1, [a, b])
    for msg_id in (a.msg_id, a.msg_id.hex().upper()):
        resp = await client.call(RequestCode.QUERY_BY_ID, {"msg_id": msg_id})
        [found] = list(iter_records(resp.body))
        assert found.body == b"A" and found.msg_id == a.msg_id
    with pytest.raises(MessageNotFoundError):
        await client.call(RequestCode.QUERY_BY_ID, {"msg_id": bytes(15) + b"\x01"})
    with pytest.raises(MalformedRequestError):
        await client.call(RequestCode.QUERY_BY_ID, {"msg_id": "not-hex"})
    now_ms = int(time.time() * 1000)
    resp = await client.call(RequestCode.QUERY_BY_KEY, {
        "topic": "query", "key": "shared", "begin_ms": now_ms - 60_000,
        "end_ms": now_ms + 60_000, "max_count": 10})
    assert sorted(m.body for m in iter_records(resp.body)) == [b"A", b"B"]
    resp = await client.call(RequestCode.QUERY_BY_KEY, {
        "topic": "query", "key": "k2", "begin_ms": 0, "end_ms": now_ms + 60_000,
        "max_count": 10})
    assert [m.body for m in iter_records(resp.body)] == [b"B"]
    resp = await client.call(RequestCode.QUERY_BY_KEY, {"topic": "query", "key": "none"})
    assert resp.fields["count"] == 0 and resp.body == b""
