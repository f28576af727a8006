"""Transactions on a real broker: half messages, END_TRANSACTION, producers and checks."""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from ferry.codec import (
    CHECK_IMMUNITY_MS,
    DELIVER_AT_MS,
    HALF_OFFSET,
    REAL_QUEUE_ID,
    REAL_TOPIC,
    TTL_MS,
    TXN_ACTION,
    TXN_BY,
    TXN_GROUP,
    TXN_ID,
    MessageFlag,
    decode_record,
)
from ferry.errors import (
    InvalidNameError,
    MalformedRequestError,
    MessageNotFoundError,
    TransactionStateError,
)
from ferry.wire import Flag, RequestCode, encode_messages

from tests.broker.conftest import Broker, start_broker
from tests.broker.txn_client import TXN_HALF, TxnClient, half_message
from tests.support.procs import Etcd

pytestmark = pytest.mark.integration

G = "orders-tx"


@pytest.fixture
async def tc(broker: Broker) -> AsyncIterator[TxnClient]:
    c = await TxnClient.connect("127.0.0.1", broker.port)
    yield c
    await c.close()


async def test_a_half_is_stored_in_half_and_invisible_in_its_topic(tc: TxnClient) -> None:
    half = await tc.begin("txn-hidden", 3, b"order-1", G, keys="order-1",
                          **{CHECK_IMMUNITY_MS: "2000", "user": "u"})
    _, in_topic = await tc.pull("txn-hidden", 3, 0)
    assert in_topic == []
    _, halves = await tc.pull("%HALF%", 0, 0, max_count=1024)
    mine = [m for m in halves if m.msg_id == half.msg_id]
    assert len(mine) == 1
    rec = mine[0]
    assert rec.body == b"order-1" and rec.tags == "t1" and rec.flags & TXN_HALF
    assert rec.keys.split(" ")[0] == "order-1"
    assert rec.properties[REAL_TOPIC] == "txn-hidden" and rec.properties[REAL_QUEUE_ID] == "3"
    assert rec.properties[TXN_GROUP] == G and rec.properties[CHECK_IMMUNITY_MS] == "2000"
    assert rec.properties["user"] == "u"


async def test_commit_stores_the_message_once_with_the_same_id(tc: TxnClient) -> None:
    half = await tc.begin("txn-commit", 1, b"paid", G, keys="order-2 k2", **{"user": "u"})
    got = await tc.end(G, half.msg_id, "commit")
    assert got == {"state": "committed", "queue_offset": 0, "repeated": False}
    _, msgs = await tc.pull("txn-commit", 1, 0)
    assert len(msgs) == 1
    msg = msgs[0]
    assert msg.msg_id == half.msg_id and msg.body == b"paid" and msg.tags == "t1"
    assert msg.keys == "order-2 k2"  # the user's keys only
    assert not msg.flags & TXN_HALF
    assert msg.properties == {"user": "u"}
    _, halves = await tc.pull("%HALF%", 0, 0, max_count=1024)
    assert msg.prepared_offset == next(m.phy_offset for m in halves if m.msg_id == half.msg_id)
    # Ending it the same way again writes nothing and answers the same.
    again = await tc.end(G, half.msg_id.hex(), "commit", from_check=True)
    assert again == {"state": "committed", "queue_offset": 0, "repeated": True}
    fields, _ = await tc.pull("txn-commit", 1, 0)
    assert fields["max_offset"] == 1
    with pytest.raises(TransactionStateError, match="committed"):
        await tc.end(G, half.msg_id, "rollback")


async def test_the_op_record_says_how_and_by_whom(tc: TxnClient) -> None:
    half = await tc.begin("txn-op", 0, b"x", G)
    await tc.end(G, half.msg_id, "rollback", from_check=True)
    _, halves = await tc.pull("%HALF%", 0, 0, max_count=1024)
    half_rec = next(m for m in halves if m.msg_id == half.msg_id)
    _, ops = await tc.pull("%OP%", 0, 0, max_count=1024)
    mine = [m for m in ops if m.properties.get(TXN_ID) == half.msg_id.hex().upper()]
    assert len(mine) == 1
    op = mine[0].properties
    assert op[TXN_ACTION] == "rollback" and op[TXN_BY] == "check"
    assert op[HALF_OFFSET] == str(half_rec.queue_offset)
    assert op[TXN_GROUP] == G and op[REAL_TOPIC] == "txn-op" and op[REAL_QUEUE_ID] == "0"
    assert mine[0].prepared_offset == half_rec.phy_offset and mine[0].tags == "rollback"
    assert mine[0].keys == "TXN:" + half.msg_id.hex().upper()


async def test_rollback_stores_nothing_and_commit_after_it_is_refused(tc: TxnClient) -> None:
    half = await tc.begin("txn-rollback", 0, b"cancelled", G)
    got = await tc.end(G, half.msg_id, "rollback")
    assert got == {"state": "rolled_back", "queue_offset": -1, "repeated": False}
    assert (await tc.end(G, half.msg_id, "rollback"))["repeated"] is True
    with pytest.raises(TransactionStateError, match="rolled back"):
        await tc.end(G, half.msg_id, "commit")
    _, msgs = await tc.pull("txn-rollback", 0, 0)
    assert msgs == []


async def test_concurrent_ends_write_one_op(tc: TxnClient) -> None:
    half = await tc.begin("txn-race", 0, b"once", G)
    outcomes = await asyncio.gather(*(tc.end(G, half.msg_id, "commit") for _ in range(8)))
    assert sorted(o["repeated"] for o in outcomes) == [False] + [True] * 7
    fields, msgs = await tc.pull("txn-race", 0, 0)
    assert len(msgs) == 1 and fields["max_offset"] == 1


async def test_unknown_transactions_and_wrong_groups(tc: TxnClient) -> None:
    with pytest.raises(MessageNotFoundError):
        await tc.end(G, bytes(range(16)), "commit")
    with pytest.raises(MessageNotFoundError):
        await tc.check(G, bytes(range(16)))
    half = await tc.begin("txn-group", 0, b"x", G)
    with pytest.raises(MalformedRequestError, match="belongs to producer group"):
        await tc.end("another-group", half.msg_id, "commit")


async def test_malformed_requests_are_refused_and_the_broker_serves_on(tc: TxnClient) -> None:
    async def send_half(msg: object) -> None:
        await tc.call(RequestCode.SEND, {"topic": "txn-bad", "queue_id": 0,
                                         "flags": msg.flags},  # type: ignore[attr-defined]
                      encode_messages([msg]))  # type: ignore[list-item]

    with pytest.raises(MalformedRequestError, match=TXN_GROUP):
        await send_half(half_message(b"x", None))
    with pytest.raises(MalformedRequestError, match=TXN_GROUP):
        await send_half(half_message(b"x", "bad group!"))
    with pytest.raises(MalformedRequestError, match="delayed"):
        await send_half(half_message(b"x", G, flags=int(MessageFlag.DELAY),
                                     **{DELIVER_AT_MS: "99999999999999"}))
    with pytest.raises(MalformedRequestError, match=CHECK_IMMUNITY_MS):
        await send_half(half_message(b"x", G, **{CHECK_IMMUNITY_MS: "soon"}))
    with pytest.raises(MalformedRequestError, match="keys"):
        await send_half(half_message(b"x", G, keys="k" * 65_500))
    no_id = half_message(b"x", G)
    no_id.msg_id = b""
    with pytest.raises(MalformedRequestError, match="msg_id"):
        await send_half(no_id)
    # Unannounced: the fast path refuses a TXN_HALF entry rather than storing it in the topic.
    with pytest.raises(MalformedRequestError):
        await tc.call(RequestCode.SEND, {"topic": "txn-bad", "queue_id": 0},
                      encode_messages([half_message(b"x", G)]))
    with pytest.raises(InvalidNameError):
        await tc.call(RequestCode.SEND, {"topic": "%HALF%", "queue_id": 0},
                      encode_messages([half_message(b"x", G)]))
    half = await tc.begin("txn-bad", 0, b"ok", G)
    for fields in ({"group": G, "msg_id": half.msg_id, "action": "maybe"},
                   {"group": G, "msg_id": b"short", "action": "commit"},
                   {"group": G, "msg_id": half.msg_id, "action": "commit", "by": "someone"},
                   {"group": G, "msg_id": half.msg_id, "action": "commit", "from_check": 1},
                   {"msg_id": half.msg_id, "action": "commit"}):
        with pytest.raises((MalformedRequestError, InvalidNameError)):
            await tc.call(RequestCode.END_TRANSACTION, fields)
    with pytest.raises(MalformedRequestError, match="role"):
        await tc.call(RequestCode.HEARTBEAT, {"client_id": "p", "group": G, "role": "boss"})
    _, msgs = await tc.pull("txn-bad", 0, 0)
    assert msgs == []  # nothing refused reached the topic
    assert (await tc.end(G, half.msg_id, "commit"))["state"] == "committed"


async def test_a_committed_ttl_message_expires_from_its_commit(tc: TxnClient) -> None:
    half = await tc.begin("txn-ttl", 0, b"short-lived", G, flags=int(MessageFlag.TTL),
                          **{TTL_MS: "60000"})
    await tc.end(G, half.msg_id, "commit")
    _, msgs = await tc.pull("txn-ttl", 0, 0)
    assert [m.body for m in msgs] == [b"short-lived"]
    assert msgs[0].flags & int(MessageFlag.TTL) and msgs[0].properties[TTL_MS] == "60000"


async def test_a_check_reaches_a_registered_producer_with_the_half(broker: Broker,
                                                                   tc: TxnClient) -> None:
    group = "check-group"
    producer = await TxnClient.connect("127.0.0.1", broker.port)
    try:
        await producer.register_producer(group, "producer-1")
        half = await producer.begin("txn-check", 2, b"ask me", group, keys="order-9")
        answer = await tc.check(group, half.msg_id)  # tc plays the txn-checker
        assert answer["forwarded"] is True and answer["client_id"] == "producer-1"
        pushed = await producer.next_push()
        assert pushed.code == RequestCode.CHECK_TRANSACTION and pushed.flags & Flag.ONEWAY
        assert pushed.fields["group"] == group and pushed.fields["msg_id"] == half.msg_id
        assert pushed.fields["topic"] == "txn-check"
        rec = decode_record(pushed.body)
        assert rec.msg_id == half.msg_id and rec.body == b"ask me" and rec.topic == "%HALF%"
        # The producer answers with a one-way END, a normal request for the broker.
        producer.oneway(RequestCode.END_TRANSACTION, {"group": group, "msg_id": half.msg_id,
                                                      "action": "commit", "from_check": True})
        _, msgs = await tc.pull("txn-check", 2, 0, max_wait_ms=5000)
        assert [m.msg_id for m in msgs] == [half.msg_id]
        # A finished transaction is never forwarded again.
        ended = await tc.check(group, half.msg_id)
        assert ended == {"forwarded": False, "state": "committed"}
        assert producer.pushed.empty()
        # Both internal topics are registered (1 queue each), so namesrv routes them.
        served = broker.get_json("/v1/stats")["served_topics"]
        assert served["%HALF%"] == 1 and served["%OP%"] == 1
        stats = broker.get_json("/v1/stats")["transactions"]
        assert stats["producers"][group] == ["producer-1"]
        assert stats["checks_forwarded"] >= 1 and stats["committed"] >= 1
        assert stats["halves_stored"] >= 1 and stats["checks_of_ended"] >= 1
    finally:
        await producer.close()


async def test_no_live_producer_means_not_forwarded(broker: Broker, tc: TxnClient) -> None:
    group = "gone-group"
    producer = await TxnClient.connect("127.0.0.1", broker.port)
    await producer.register_producer(group, "p-gone")
    half = await producer.begin("txn-gone", 0, b"x", group)
    await producer.close()  # its registration goes with the connection
    for _ in range(50):
        if group not in broker.get_json("/v1/stats")["transactions"]["producers"]:
            break
        await asyncio.sleep(0.1)
    assert await tc.check(group, half.msg_id) == {"forwarded": False, "state": "open"}
    # A producer of another group is not asked either.
    await tc.register_producer("other-group", "p-other")
    assert (await tc.check(group, half.msg_id))["forwarded"] is False
    assert tc.pushed.empty()


async def test_checks_go_round_robin_over_the_group(broker: Broker, tc: TxnClient) -> None:
    group = "rr-group"
    a = await TxnClient.connect("127.0.0.1", broker.port)
    b = await TxnClient.connect("127.0.0.1", broker.port)
    try:
        await a.register_producer(group, "a")
        await b.register_producer(group, "b")
        half = await a.begin("txn-rr", 0, b"x", group)
        asked = {(await tc.check(group, half.msg_id))["client_id"] for _ in range(4)}
        assert asked == {"a", "b"}
        assert a.pushed.qsize() == 2 and b.pushed.qsize() == 2
    finally:
        await a.close()
        await b.close()


async def test_the_state_survives_a_kill9(tmp_path: Path, etcd: Etcd) -> None:
    # Sync flush: an END is answered once its op record is on disk.
    data = tmp_path / "data"
    b1 = start_broker(tmp_path / "one", etcd, data_dir=data, FERRY_BROKER_FLUSH_MODE="sync")
    c = await TxnClient.connect("127.0.0.1", b1.port)
    committed = await c.begin("txn-restart", 0, b"c", G)
    rolled = await c.begin("txn-restart", 0, b"r", G)
    still_open = await c.begin("txn-restart", 0, b"o", G)
    await c.end(G, committed.msg_id, "commit")
    await c.end(G, rolled.msg_id, "rollback")
    await c.close()
    b1.proc.kill9()
    b2 = start_broker(tmp_path / "two", etcd, data_dir=data, FERRY_BROKER_FLUSH_MODE="sync")
    try:
        c = await TxnClient.connect("127.0.0.1", b2.port)
        assert (await c.end(G, committed.msg_id, "commit"))["repeated"] is True
        with pytest.raises(TransactionStateError):
            await c.end(G, rolled.msg_id, "commit")
        assert (await c.check(G, committed.msg_id))["state"] == "committed"
        assert (await c.check(G, still_open.msg_id))["state"] == "open"
        assert (await c.end(G, still_open.msg_id, "commit"))["repeated"] is False
        msgs = await c.pull_all("txn-restart", 0, 0)   # the kill -9 began a new history
        assert sorted(m.body for m in msgs) == [b"c", b"o"]
        await c.close()
    finally:
        b2.proc.stop()


async def test_64_concurrent_ends_each_get_their_answer_and_one_op(broker: Broker,
                                                                   tc: TxnClient) -> None:
    # 48 transactions ended at once (the broker writes them in shared batches), 8 of
    # them ended again the same way and 8 the other way, from a second connection.
    halves = [await tc.begin("txn-many", i % 4, b"m%d" % i, G) for i in range(48)]
    first = {h.msg_id: ("commit" if i % 3 else "rollback") for i, h in enumerate(halves)}
    other = {"commit": "rollback", "rollback": "commit"}
    dups = [(h.msg_id, first[h.msg_id]) for h in halves[:8]]
    dups += [(h.msg_id, other[first[h.msg_id]]) for h in halves[8:16]]
    tc2 = await TxnClient.connect("127.0.0.1", broker.port)
    try:
        calls = [tc.end(G, mid, action) for mid, action in first.items()]
        calls += [tc2.end(G, mid, action) for mid, action in dups]
        outcomes = await asyncio.gather(*calls, return_exceptions=True)
    finally:
        await tc2.close()
    asked = list(first.items()) + dups
    assert len(asked) == 64
    winner: dict[bytes, str] = {}
    for (mid, action), got in zip(asked, outcomes, strict=True):
        if isinstance(got, dict) and not got["repeated"]:
            assert mid not in winner  # one END per transaction writes
            winner[mid] = action
    assert set(winner) == set(first)
    states = {"commit": "committed", "rollback": "rolled_back"}
    for (mid, action), got in zip(asked, outcomes, strict=True):
        if action == winner[mid]:
            assert isinstance(got, dict) and got["state"] == states[action]
            assert (got["queue_offset"] >= 0) == (action == "commit")
        else:
            assert isinstance(got, TransactionStateError)
    _, ops = await tc.pull("%OP%", 0, 0, max_count=1024)
    mine = [m for m in ops if bytes.fromhex(m.properties[TXN_ID]) in first]
    assert sorted(m.properties[TXN_ID] for m in mine) == sorted(mid.hex().upper() for mid in first)
    assert all(m.properties[TXN_ACTION] == winner[bytes.fromhex(m.properties[TXN_ID])]
               for m in mine)
    stored = []
    for queue_id in range(4):
        _, msgs = await tc.pull("txn-many", queue_id, 0, max_count=1024)
        stored += [m.msg_id for m in msgs]
    assert sorted(stored) == sorted(mid for mid, a in winner.items() if a == "commit")
