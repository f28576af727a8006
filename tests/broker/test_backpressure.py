"""A client that stops reading its responses pins only a bounded amount of broker memory."""
from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from ferry.store import MessageIn, MessageStore, StoreConfig
from ferry.wire import FrameDecoder, RequestCode, encode_frame, request
from ferry_broker.config import BrokerConfig
from ferry_broker.connection import BrokerProtocol
from ferry_broker.consumer_offsets import ConsumerOffsetManager
from ferry_broker.consumers import ConsumerManager
from ferry_broker.context import BrokerContext
from ferry_broker.durability import DurabilityWaiter
from ferry_broker.handlers import HANDLERS
from ferry_broker.long_poll import LongPollManager
from ferry_broker.server import BrokerServer
from ferry_broker.topics import TopicManager

BUDGET = 2 << 20
RESPONSE = 1 << 20  # each PULL answers about this much


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[BrokerServer]:
    config = BrokerConfig(data_dir=str(tmp_path), etcd="", http_port=0, port=1,
                          max_unwritten_bytes_per_conn=BUDGET)
    store = MessageStore(StoreConfig(root_dir=str(tmp_path), commitlog_segment_bytes=64 << 20))
    store.put_batch([MessageIn(topic="big", queue_id=0, body=b"p" * (64 << 10))
                     for _ in range(16)])
    ctx = BrokerContext(config, store, ConsumerOffsetManager(tmp_path / "o.json"),
                        ConsumerManager(30_000), LongPollManager(256, 10_000),
                        TopicManager(config, None), DurabilityWaiter(config.flush_timeout_ms))
    srv = BrokerServer(ctx, HANDLERS)
    await srv.start("127.0.0.1", 0)
    yield srv
    srv.stop_accepting()
    await srv.drain(2)
    store.close()


def pull(rid: int) -> bytes:
    return encode_frame(request(RequestCode.PULL, rid, {
        "group": "g", "topic": "big", "queue_id": 0, "offset": 0, "max_count": 64,
        "max_bytes": RESPONSE, "max_wait_ms": 0, "tags": None, "sql": None}))


async def test_unread_responses_stop_new_requests_then_all_are_answered(
        server: BrokerServer) -> None:
    n = 200  # 200 MiB of answers if nothing held them back
    sock = socket.create_connection(("127.0.0.1", server.port))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 10)
    sock.sendall(b"".join(pull(rid) for rid in range(1, n + 1)))
    await asyncio.sleep(1.0)  # the broker answers until the unread bytes pile up
    (conn,) = list(server.connections)
    assert isinstance(conn, BrokerProtocol)
    assert conn.transport is not None
    held = conn.transport.get_write_buffer_size() + conn._cork.nbytes
    assert held <= BUDGET + 2 * RESPONSE, held
    assert conn._turns or conn._backlog, "requests should wait rather than answer into memory"

    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    decoder, answered = FrameDecoder(), []
    while len(answered) < n:
        data = await asyncio.wait_for(loop.sock_recv(sock, 1 << 20), 20)
        assert data, "the broker closed the connection"
        answered.extend(decoder.feed(data))
    sock.close()
    assert sorted(f.request_id for f in answered) == list(range(1, n + 1))
    assert all(f.error == 0 and len(f.body) > RESPONSE // 2 for f in answered)
