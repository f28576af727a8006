"""The wire server in-process, with handler tables that misbehave on purpose."""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from ferry.errors import BusyError, SystemError_
from ferry.store import MessageStore, StoreConfig
from ferry.wire import Frame, check_response, encode_frame, request, response
from ferry_broker.config import BrokerConfig
from ferry_broker.consumer_offsets import ConsumerOffsetManager
from ferry_broker.consumers import ConsumerManager
from ferry_broker.context import BrokerContext, ConnInfo, Handler
from ferry_broker.durability import DurabilityWaiter
from ferry_broker.handlers import HANDLERS
from ferry_broker.long_poll import LongPollManager
from ferry_broker.server import BrokerServer
from ferry_broker.topics import TopicManager

from tests.broker.wire_client import WireClient

CRASH, SLOW, ECHO, BUSY = 90, 91, 92, 93


async def crash(ctx: BrokerContext, conn: ConnInfo, req: Frame) -> Frame:
    raise RuntimeError("secret internals")


async def slow(ctx: BrokerContext, conn: ConnInfo, req: Frame) -> Frame:
    await asyncio.sleep(req.fields.get("s", 0.2))
    return response(req, {"done": "slow"})


async def echo(ctx: BrokerContext, conn: ConnInfo, req: Frame) -> Frame:
    return response(req, {"peer": conn.peer, **req.fields}, req.body)


async def busy(ctx: BrokerContext, conn: ConnInfo, req: Frame) -> Frame:
    raise BusyError("try later")


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[BrokerServer]:
    config = BrokerConfig(data_dir=str(tmp_path), etcd="", http_port=0, port=1,
                          max_inflight_per_conn=4, max_held_pulls_per_conn=3)
    store = MessageStore(StoreConfig(root_dir=str(tmp_path), commitlog_segment_bytes=64 << 20))
    ctx = BrokerContext(config, store, ConsumerOffsetManager(tmp_path / "o.json"),
                        ConsumerManager(30_000), LongPollManager(3, 16), TopicManager(config, None),
                        DurabilityWaiter(config.flush_timeout_ms))
    handlers: dict[int, Handler] = {**HANDLERS, CRASH: crash, SLOW: slow, ECHO: echo, BUSY: busy}
    srv = BrokerServer(ctx, handlers)
    await srv.start("127.0.0.1", 0)
    yield srv
    srv.stop_accepting()
    await srv.drain(2)
    store.close()


async def connect(srv: BrokerServer) -> WireClient:
    return await WireClient.connect("127.0.0.1", srv.port)


async def test_crash_is_a_system_error_without_internals(server: BrokerServer) -> None:
    c = await connect(server)
    resp = await c.request(CRASH)
    assert resp.error == SystemError_.code and "secret" not in resp.message
    with pytest.raises(BusyError):
        check_response(await c.request(BUSY))
    assert (await c.call(ECHO, {"a": 1}, b"xyz")).body == b"xyz"
    await c.close()


async def test_oneway_failure_sends_nothing(server: BrokerServer) -> None:
    c = await connect(server)
    c.oneway(CRASH, {})
    resp = await c.call(ECHO, {"after": True})
    assert resp.fields["after"] is True and resp.request_id == 2
    await c.close()


async def test_responses_come_back_out_of_order(server: BrokerServer) -> None:
    c = await connect(server)
    slow_call = asyncio.create_task(c.call(SLOW, {"s": 0.3}))
    await asyncio.sleep(0.05)
    fast = await c.call(ECHO, {"n": 1})
    assert fast.fields["n"] == 1 and not slow_call.done()
    assert (await slow_call).fields["done"] == "slow"
    await c.close()


async def test_inflight_limit_pauses_reading_but_answers_everything(
        server: BrokerServer) -> None:
    c = await connect(server)
    results = await asyncio.gather(*(c.call(SLOW, {"s": 0.05}) for _ in range(20)))
    assert len(results) == 20
    await c.close()


async def test_one_write_of_many_frames_runs_at_most_the_limit_at_once(
        server: BrokerServer) -> None:
    running, peak = 0, 0

    async def counted(ctx: BrokerContext, conn: ConnInfo, req: Frame) -> Frame:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0.01)
        running -= 1
        return response(req, {"i": req.fields["i"]})

    server.handlers[94] = counted
    c = await connect(server)
    rids = list(range(1, 51))
    futs = {}
    loop = asyncio.get_running_loop()
    for rid in rids:
        futs[rid] = c.pending[rid] = loop.create_future()
    c.write_raw(b"".join(encode_frame(request(94, rid, {"i": rid})) for rid in rids))
    done = await asyncio.gather(*futs.values())
    assert sorted(f.fields["i"] for f in done) == rids
    assert peak == 4  # the fixture's max_inflight_per_conn
    await c.close()


async def test_closed_connection_frees_its_parked_pulls(server: BrokerServer) -> None:
    c = await connect(server)
    pulls = [asyncio.create_task(c.pull("parked", 0, 0, max_wait_ms=15_000))
             for _ in range(3)]
    await asyncio.sleep(0.1)
    assert server.ctx.long_poll.held == 3
    await c.close()
    for p in pulls:
        with pytest.raises((ConnectionError, asyncio.CancelledError)):
            await p
    await asyncio.sleep(0.1)
    assert server.ctx.long_poll.held == 0


async def test_held_pull_limit_is_busy(server: BrokerServer) -> None:
    c = await connect(server)  # the fixture allows 3 parked pulls per connection
    pulls = [asyncio.create_task(c.pull("limit", 0, 0, max_wait_ms=15_000)) for _ in range(3)]
    await asyncio.sleep(0.1)
    with pytest.raises(BusyError):
        await c.pull("limit", 0, 0, max_wait_ms=1000)
    await c.close()
    for p in pulls:
        with pytest.raises((ConnectionError, asyncio.CancelledError)):
            await p
    # The connection sat at its in-flight limit; the broker still sees it close.
    await asyncio.sleep(0.2)
    assert server.ctx.long_poll.held == 0
