"""PULL and queue histories against an in-process broker whose store the test changes
directly: what a parked pull answers when the log is truncated and rewritten meanwhile
(a demoted master rejoining its new master, issue 16)."""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from ferry.codec.record import AT_PHY_OFFSET, I64
from ferry.store import MessageIn, MessageStore, StoreConfig
from ferry_broker.config import BrokerConfig
from ferry_broker.consumer_offsets import ConsumerOffsetManager
from ferry_broker.consumers import ConsumerManager
from ferry_broker.context import BrokerContext
from ferry_broker.durability import DurabilityWaiter
from ferry_broker.handlers import HANDLERS
from ferry_broker.long_poll import LongPollManager
from ferry_broker.server import BrokerServer
from ferry_broker.topics import TopicManager

from tests.broker.wire_client import WireClient


def _put(store: MessageStore, n: int, body: bytes) -> None:
    store.put_batch([MessageIn(topic="t", queue_id=0, body=body) for _ in range(n)])


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[BrokerServer]:
    config = BrokerConfig(data_dir=str(tmp_path), etcd="", http_port=0, port=1)
    store = MessageStore(StoreConfig(root_dir=str(tmp_path), commitlog_segment_bytes=64 << 20))
    ctx = BrokerContext(config, store, ConsumerOffsetManager(tmp_path / "o.json"),
                        ConsumerManager(30_000), LongPollManager(256, 10_000),
                        TopicManager(config, None), DurabilityWaiter(config.flush_timeout_ms))
    srv = BrokerServer(ctx, HANDLERS)
    await srv.start("127.0.0.1", 0)
    yield srv
    srv.stop_accepting()
    await srv.drain(2)
    store.close()


async def test_a_parked_pull_is_sent_back_when_the_log_is_rewritten_meanwhile(
        server: BrokerServer) -> None:
    store = server.ctx.store
    _put(store, 10, b"old")
    client = await WireClient.connect("127.0.0.1", server.port)
    try:
        fields, msgs = await client.pull("t", 0, 0, max_count=100)
        assert len(msgs) == 10 and fields["next_offset"] == 10
        hist = fields["hist"]
        # The reader has 0..9 and parks at 10 with their history.
        parked = asyncio.create_task(client.pull("t", 0, 10, hist=hist, max_wait_ms=5_000))
        await asyncio.sleep(0.3)
        assert not parked.done()
        # The log is cut back to queue offset 6 and rewritten past 10, then the poll wakes.
        store.truncate_to(_phy_of(store, 6))
        _put(store, 8, b"new")   # queue offsets 6..13, a new history
        server.ctx.long_poll.notify("t", 0)
        fields, msgs = await asyncio.wait_for(parked, 10)
        # Not FOUND from 10 (that would skip the new 6..9): back to where the logs part.
        assert fields["status"] == "HISTORY_DIVERGED" and fields["next_offset"] == 6
        assert msgs == []
        fields, msgs = await client.pull("t", 0, 6, max_count=100, hist=fields["hist"])
        assert [m.body for m in msgs] == [b"new"] * 8
    finally:
        await client.close()


async def test_past_the_end_of_the_open_history_waits_there(server: BrokerServer) -> None:
    store = server.ctx.store
    _put(store, 3, b"x")
    client = await WireClient.connect("127.0.0.1", server.port)
    try:
        fields, _ = await client.pull("t", 0, 0)
        # A reader further on in the same history (read from a replica ahead of this one):
        # not moved back (no duplicates, no false warning); it is served once records come.
        parked = asyncio.create_task(client.pull("t", 0, 5, hist=fields["hist"],
                                                 max_wait_ms=5_000))
        await asyncio.sleep(0.3)
        assert not parked.done()
        _put(store, 4, b"y")
        server.ctx.long_poll.notify("t", 0)
        fields, msgs = await asyncio.wait_for(parked, 10)
        assert fields["status"] == "FOUND" and [m.queue_offset for m in msgs] == [5, 6]
    finally:
        await client.close()


async def test_without_a_history_past_the_end_goes_to_the_oldest_record(
        server: BrokerServer) -> None:
    store = server.ctx.store
    _put(store, 200, b"a")   # a disk lost: the first history starts at 0
    store.histories.start_run(store.commit_log_max_offset)   # then a kill -9: a second one
    _put(store, 5, b"b")
    client = await WireClient.connect("127.0.0.1", server.port)
    try:
        # A reader at 5000 of a log it never saw, no history named: sent to 0, not 200.
        fields, _ = await client.pull("t", 0, 5000)
        assert fields["status"] == "OFFSET_OVERFLOW_BADLY" and fields["next_offset"] == 0
    finally:
        await client.close()


def _phy_of(store: MessageStore, queue_offset: int) -> int:
    """The commit-log offset of the record at `queue_offset` of t/0."""
    got = store.get_messages("t", 0, queue_offset, 1)
    return int(I64.unpack_from(got.records[0], AT_PHY_OFFSET)[0])
