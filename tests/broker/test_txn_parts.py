"""Transaction parts in-process: the producer registry and END after a torn commit write."""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from ferry.codec import TXN_GROUP, MessageFlag, encode_properties, new_msg_id
from ferry.errors import TransactionStateError
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
