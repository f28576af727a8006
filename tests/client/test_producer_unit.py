"""Producer queue choice, ordered retries and the byte budget, without processes.

The SEND requests go to an in-process stand-in for the broker (it appends each
frame's messages to a per-queue list and answers with the first offset), so
that a failure can be injected at an exact batch.
"""
from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from ferry.client.core.namesrv import BrokerRoute, TopicRoute
from ferry.client.producing.buffer import ByteBudget
from ferry.client.producing.producer import Producer
from ferry.errors import BusyError, ConnectionLostError
from ferry.wire import decode_messages


class FakeFrame:
    def __init__(self, fields: dict[str, Any]) -> None:
        self.fields = fields


def _route(topic: str) -> TopicRoute:
    return TopicRoute(topic, "normal", "rw", (
        BrokerRoute("broker-a", "c", "127.0.0.1:1", 4), BrokerRoute("broker-b", "c", "127.0.0.1:2", 4)))


_OPEN: list[Producer] = []


def _producer(topic: str, **kw: Any) -> Producer:
    p = Producer(namesrv="127.0.0.1:1", **kw)
    p._started = True
    p._routes._routes[topic] = (time.monotonic() + 3600, _route(topic))
    _OPEN.append(p)
    return p


@pytest.fixture(autouse=True)
async def _close_producers() -> Any:
    yield
    while _OPEN:
        p = _OPEN.pop()
        await p._namesrv.close()   # a refreshed route opened its HTTP session


class Broker:
    """Stores SEND bodies per queue; fails the first `fail_first` SENDs after `delay_s`."""

    def __init__(self, delay_s: float = 0.0, fail_first: int = 0) -> None:
        self.delay_s = delay_s
        self.fail_first = fail_first
        self.queues: dict[tuple[str, int], list[bytes]] = {}
        self.tried: list[tuple[str, int]] = []   # every SEND's (address, queue id)

    async def request(self, addr: str, code: int, fields: dict[str, Any],
                      body: bytes = b"") -> FakeFrame:
        self.tried.append((addr, fields["queue_id"]))
        await asyncio.sleep(self.delay_s)
        if self.fail_first > 0:
            self.fail_first -= 1
            raise ConnectionLostError("injected")
        q = self.queues.setdefault((addr, fields["queue_id"]), [])
        first = len(q)
        q.extend(m.body for m in decode_messages(body))
        return FakeFrame({"queue_offset": first, "queue_id": fields["queue_id"]})


async def test_ordered_key_keeps_its_queue_while_a_broker_is_skipped() -> None:
    p = _producer("t")
    route = _route("t")
    before = {k: p._chooser.by_key("t", route, f"key{k}", True) for k in range(50)}
    assert {tq.broker for tq in before.values()} == {"broker-a", "broker-b"}
    p._chooser.mark_faulty("broker-a")
    after = {k: p._chooser.by_key("t", route, f"key{k}", True) for k in range(50)}
    assert after == before
    # plain messages do avoid the skipped broker
    assert {p._chooser.by_key("t", route, None, False).broker for _ in range(20)} == {"broker-b"}


async def test_ordered_retry_stays_on_the_queue_and_keeps_send_order() -> None:
    broker = Broker(delay_s=0.01, fail_first=1)
    p = _producer("t", retry_backoff_ms=5, linger_ms=0)
    p._pool.request = broker.request  # type: ignore[method-assign]
    futs = []
    for i in range(30):
        futs.append(await p.send("t", f"m{i}".encode(), key="k", ordered=True))
        await asyncio.sleep(0.002)   # several batches, so more than one could be in flight
    results = await asyncio.gather(*futs)
    assert len({(r.broker, r.queue_id) for r in results}) == 1
    (stored,) = broker.queues.values()
    assert stored == [f"m{i}".encode() for i in range(30)]
    assert [r.queue_offset for r in results] == list(range(30))
    assert p.buffered_bytes == 0


async def test_ordered_send_fails_on_its_queue_after_retries() -> None:
    broker = Broker(fail_first=10)
    p = _producer("t", retries=2, retry_backoff_ms=1)
    p._pool.request = broker.request  # type: ignore[method-assign]
    fut = await p.send("t", b"x", key="k", ordered=True)
    with pytest.raises(ConnectionLostError):
        await asyncio.wait_for(fut, 5)
    assert len(broker.tried) == 3 and len(set(broker.tried)) == 1   # all on the key's queue
    assert not broker.queues and p.buffered_bytes == 0
    # a plain message fails over and is stored
    broker.fail_first = 1
    await asyncio.wait_for(await p.send("t", b"y"), 5)
    assert sum(len(q) for q in broker.queues.values()) == 1 and p.buffered_bytes == 0


async def test_a_retry_with_no_queue_left_fails_the_futures() -> None:
    """Finding 9: the refreshed route has no writable queue; the futures fail, never hang."""
    p = _producer("t")

    async def request(addr: str, code: int, fields: dict[str, Any], body: bytes = b"") -> None:
        read_only = TopicRoute("t", "normal", "r", _route("t").brokers)
        p._routes._routes["t"] = (time.monotonic(), read_only)
        raise ConnectionLostError("injected")

    p._pool.request = request  # type: ignore[method-assign]
    futs = [await p.send("t", f"m{i}".encode()) for i in range(5)]
    done, pending = await asyncio.wait(futs, timeout=5)
    assert not pending
    assert all(type(f.exception()).__name__ == "TopicNotFoundError" for f in done)
    await asyncio.wait_for(p.flush(), 5)
    assert p.buffered_bytes == 0


async def test_byte_budget_waits_in_order_and_times_out() -> None:
    budget = ByteBudget(100)
    assert budget.try_take(60)
    order: list[str] = []

    async def taker(name: str, size: int, timeout_ms: int) -> None:
        await budget.take(size, timeout_ms)
        order.append(name)

    first = asyncio.create_task(taker("first", 50, 5_000))
    second = asyncio.create_task(taker("second", 10, 5_000))   # fits, but queues behind first
    await asyncio.sleep(0.01)
    assert order == []
    budget.release(60)
    await asyncio.gather(first, second)
    assert order == ["first", "second"] and budget.used_bytes == 60
    with pytest.raises(BusyError, match="max_block_ms"):
        await budget.take(50, 20)
    assert budget.used_bytes == 60 and not budget.waiters
    budget.release(60)
    await budget.take(500, 10)   # larger than the whole budget: let in alone
    assert budget.used_bytes == 500


async def test_send_blocks_when_the_buffer_is_full_then_raises_busy() -> None:
    gate = asyncio.Event()

    async def request(addr: str, code: int, fields: dict[str, Any], body: bytes = b"") -> FakeFrame:
        await gate.wait()
        return FakeFrame({"queue_offset": 0, "queue_id": fields["queue_id"]})

    p = _producer("t", buffer_memory_bytes=16 * 1024, max_block_ms=200)
    p._pool.request = request  # type: ignore[method-assign]
    futs = []
    t0 = time.monotonic()
    with pytest.raises(BusyError):
        for _ in range(100):
            futs.append(await p.send("t", b"x" * 1000))
    assert time.monotonic() - t0 >= 0.19
    assert 14 <= len(futs) <= 16 and p.buffered_bytes <= 16 * 1024
    assert p.send_oneway("t", b"y" * 1000) is False     # dropped, not queued
    gate.set()
    await asyncio.gather(*futs)
    await p.flush()
    assert p.buffered_bytes == 0
