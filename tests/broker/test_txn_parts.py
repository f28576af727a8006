"""Transaction parts in-process: the producer registry, END after a torn commit write,
and the group commit of concurrent ENDs."""
from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterator
from pathlib import Path

import pytest
from ferry.codec import TXN_GROUP, MessageFlag, encode_properties, new_msg_id
from ferry.errors import StoreUnavailableError, TransactionStateError
from ferry.names import OP_TOPIC
from ferry.store import MessageIn, MessageStore, StoreConfig
from ferry.wire import Frame, RequestCode, request
from ferry_broker.config import BrokerConfig
from ferry_broker.consumer_offsets import ConsumerOffsetManager
from ferry_broker.consumers import ConsumerManager
from ferry_broker.context import BrokerContext, ConnInfo
from ferry_broker.durability import DurabilityWaiter
from ferry_broker.handlers.transactions import handle_end_transaction
from ferry_broker.long_poll import LongPollManager
from ferry_broker.producers import ProducerManager
from ferry_broker.put_pipeline import PutBatch
from ferry_broker.topics import TopicManager
from ferry_broker.transactions import committed_message, find_half, user_keys, with_txn_key


def _push(frame: Frame) -> bool:
    return True


def test_producers_expire_leave_with_their_connection_and_take_turns() -> None:
    now = [0.0]
    pm = ProducerManager(expiry_ms=1000, clock_ms=lambda: now[0])
    assert pm.heartbeat("a", "g", 1, _push) and pm.heartbeat("b", "g", 2, _push)
    firsts = [pm.pick("g")[0].client_id for _ in range(4)]
    assert firsts == ["a", "b", "a", "b"]
    assert pm.connection_closed(1) == 1
    assert [p.client_id for p in pm.pick("g")] == ["b"]
    # "b" reconnects: its old connection closing later must not drop it.
    assert pm.heartbeat("b", "g", 3, _push)
    pm.connection_closed(2)
    assert [p.conn_id for p in pm.pick("g")] == [3]
    now[0] = 1500.0
    assert pm.pick("g") == [] and pm.groups() == {}
    assert pm.heartbeat("c", "g", 4, _push) and pm.unregister("c", "g")
    assert pm.groups() == {}


def test_the_transaction_key_is_appended_and_stripped() -> None:
    mid = bytes(range(16))
    for keys in ("", "order-1", "a b", "TXN:00"):
        assert user_keys(with_txn_key(keys, mid), mid) == keys


@pytest.fixture
def ctx(tmp_path: Path) -> Iterator[BrokerContext]:
    config = BrokerConfig(data_dir=str(tmp_path), etcd="", http_port=0, port=1)
    store = MessageStore(StoreConfig(root_dir=str(tmp_path), commitlog_segment_bytes=8 << 20))
    yield BrokerContext(config, store, ConsumerOffsetManager(tmp_path / "o.json"),
                        ConsumerManager(30_000), LongPollManager(3, 16),
                        TopicManager(config, None), DurabilityWaiter(config.flush_timeout_ms))
    store.close()


async def test_a_commit_torn_after_the_real_message_writes_the_op_alone(
        ctx: BrokerContext) -> None:
    mid = new_msg_id()
    msg = MessageIn("torn", 0, b"body", "t", "k", encode_properties({TXN_GROUP: "g"}), mid,
                    int(MessageFlag.TXN_HALF), 1)
    await ctx.pipeline.put_messages(PutBatch("torn", 0, [msg]))
    half = find_half(ctx.store, mid)
    assert half is not None
    # The crash case: the commit's write kept the real message and lost the op after it.
    ctx.store.put(committed_message(half))
    req = request(RequestCode.END_TRANSACTION, 1, {"group": "g", "msg_id": mid,
                                                   "action": "commit"})
    resp = await handle_end_transaction(ctx, ConnInfo(1, "127.0.0.1:1"), req)
    assert resp.fields == {"state": "committed", "queue_offset": 0, "repeated": False}
    assert ctx.store.max_offset("torn", 0) == 1  # no second copy
    assert ctx.store.max_offset(OP_TOPIC, 0) == 1


async def test_a_rollback_after_a_torn_commit_records_the_commit(ctx: BrokerContext) -> None:
    mid = new_msg_id()
    msg = MessageIn("torn-rb", 0, b"body", "t", "", encode_properties({TXN_GROUP: "g"}), mid,
                    int(MessageFlag.TXN_HALF), 1)
    await ctx.pipeline.put_messages(PutBatch("torn-rb", 0, [msg]))
    half = find_half(ctx.store, mid)
    assert half is not None
    ctx.store.put(committed_message(half))  # the op record after it was lost
    conn = ConnInfo(1, "127.0.0.1:1")
    fields = {"group": "g", "msg_id": mid, "action": "rollback", "by": "discarded"}
    with pytest.raises(TransactionStateError, match="already committed"):
        await handle_end_transaction(ctx, conn, request(RequestCode.END_TRANSACTION, 1, fields))
    again = await handle_end_transaction(ctx, conn, request(
        RequestCode.END_TRANSACTION, 2, {**fields, "action": "commit"}))
    assert again.fields["state"] == "committed" and again.fields["repeated"] is True
    assert ctx.store.max_offset("torn-rb", 0) == 1


async def _halves(ctx: BrokerContext, n: int) -> list[bytes]:
    ids = [new_msg_id() for _ in range(n)]
    msgs = [MessageIn("grouped", 0, b"b", "t", "", encode_properties({TXN_GROUP: "g"}), mid,
                      int(MessageFlag.TXN_HALF), 1) for mid in ids]
    await ctx.pipeline.put_messages(PutBatch("grouped", 0, msgs))
    return ids


def _end(ctx: BrokerContext, mid: bytes, action: str, request_id: int) -> Awaitable[Frame]:
    req = request(RequestCode.END_TRANSACTION, request_id,
                  {"group": "g", "msg_id": mid, "action": action})
    return handle_end_transaction(ctx, ConnInfo(1, "127.0.0.1:1"), req)


async def test_ends_of_one_turn_share_one_store_write(ctx: BrokerContext) -> None:
    ids = await _halves(ctx, 6)
    actions = ["commit", "rollback"] * 3
    ends = [_end(ctx, mid, a, i) for i, (mid, a) in enumerate(zip(ids, actions, strict=True))]
    # The same END twice and the opposite END, in the same batch as the first.
    ends += [_end(ctx, ids[0], "commit", 10), _end(ctx, ids[0], "rollback", 11)]
    got = await asyncio.gather(*ends, return_exceptions=True)
    assert ctx.txn_ends.writes == 1
    assert [r.fields["repeated"] for r in got[:6]] == [False] * 6  # type: ignore[union-attr]
    assert [r.fields["queue_offset"] for r in got[:6:2]] == [0, 1, 2]  # type: ignore[union-attr]
    assert got[6].fields == {"state": "committed", "queue_offset": 0,  # type: ignore[union-attr]
                             "repeated": True}
    assert isinstance(got[7], TransactionStateError)
    assert ctx.store.max_offset(OP_TOPIC, 0) == 6 and ctx.store.max_offset("grouped", 0) == 3
    assert not ctx.txn_ends.pending


async def test_a_failed_batch_fails_every_end_in_it(ctx: BrokerContext) -> None:
    ids = await _halves(ctx, 3)
    ctx.health.set_stalled("the disk is stalled (test)")
    got = await asyncio.gather(*(_end(ctx, mid, "commit", i) for i, mid in enumerate(ids)),
                               _end(ctx, ids[0], "commit", 9), return_exceptions=True)
    assert all(isinstance(r, StoreUnavailableError) for r in got)
    assert ctx.store.max_offset(OP_TOPIC, 0) == 0 and not ctx.txn_ends.pending
    ctx.health.set_stalled(None)  # the transactions are still open: ending them now works
    again = await asyncio.gather(*(_end(ctx, mid, "commit", i) for i, mid in enumerate(ids)))
    assert [r.fields["repeated"] for r in again] == [False] * 3
