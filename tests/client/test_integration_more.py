"""More client behaviour against real processes: namesrv fail-over, tags, back-pressure, limits."""
from __future__ import annotations

import asyncio

import pytest
from ferry import Admin, Consumer, Producer
from ferry.client.core.namesrv import NamesrvClient, RouteCache
from ferry.errors import InvalidNameError, MessageTooLargeError, TopicNotFoundError

from tests.client.conftest import Mesh, unique
from tests.client.util import FAST, collect
from tests.support.procs import free_port

pytestmark = pytest.mark.integration


async def test_namesrv_client_tries_the_next_address(mesh: Mesh) -> None:
    topic = unique("ns")
    client = NamesrvClient(f"127.0.0.1:{free_port()},{mesh.namesrv}")
    try:
        with pytest.raises(TopicNotFoundError):
            await client.get_route(topic)
        route = await client.get_route(topic, create=True)
        assert [b.name for b in route.brokers] == sorted(mesh.brokers)
        assert len(route.writable_queues()) == 8
        cache = RouteCache(client)
        assert await cache.route(topic) == route
        cache.invalidate(topic)
        assert await cache.route(topic) == route
    finally:
        await client.close()


async def test_tag_filter_delivers_only_matching_and_commits_past_the_rest(mesh: Mesh) -> None:
    topic, group = unique("tags"), unique("g")
    async with Producer(namesrv=mesh.namesrv) as producer:
        futs = [await producer.send(topic, f"{tag}{i}".encode(), tags=tag)
                for i in range(30) for tag in ("a", "b", "c")]
        await asyncio.gather(*futs)
    async with Consumer(topic, group=group, namesrv=mesh.namesrv, tags="a||c",
                        auto_offset_reset="earliest", **FAST) as consumer:
        got = (await collect([consumer], 60, settle_s=0.5))[0]
        await consumer.commit()
    assert sorted(r.body for r in got) == sorted(f"{t}{i}".encode() for i in range(30)
                                                 for t in ("a", "c"))
    async with Admin(namesrv=mesh.namesrv) as admin:
        lags = await admin.group_lag(group, [topic])
    assert sum(q.lag for q in lags) <= sum(1 for q in lags if q.max_offset)  # trailing b's at most


async def test_prefetch_bound_gives_back_pressure(mesh: Mesh) -> None:
    topic = unique("bp")
    async with Admin(namesrv=mesh.namesrv) as admin:
        await admin.create_topic(topic, queues=1, brokers=["broker-a"])
    async with Producer(namesrv=mesh.namesrv) as producer:
        futs = [await producer.send(topic, b"z") for _ in range(300)]
        await asyncio.gather(*futs)
    async with Consumer(topic, group=unique("g"), namesrv=mesh.namesrv,
                        auto_offset_reset="earliest", prefetch_records_per_queue=10,
                        pull_batch_size=5, **FAST) as consumer:
        await asyncio.sleep(1.0)
        (tq,) = consumer.assignment()
        assert 10 <= consumer.describe()["queues"][str(tq)]["buffered"] <= 14
        got = (await collect([consumer], 300))[0]
    assert len(got) == 300
    assert [r.queue_offset for r in got] == list(range(300))


async def test_bad_input_is_refused_before_sending(mesh: Mesh) -> None:
    async with Producer(namesrv=mesh.namesrv) as producer:
        with pytest.raises(InvalidNameError):
            await producer.send("bad topic", b"x")
        with pytest.raises(MessageTooLargeError):
            await producer.send(unique("big"), b"x" * (4 * 1024 * 1024 + 1))
        with pytest.raises(TypeError):
            await producer.send(unique("t"), "not bytes")  # type: ignore[arg-type]
    with pytest.raises(RuntimeError):
        await Producer(namesrv=mesh.namesrv).send("t", b"x")   # not started
    with pytest.raises(ValueError):
        Consumer("t", group="g", pull_max_wait_ms=15_000, request_timeout_ms=10_000)


async def test_async_for_yields_each_record_once_and_ends_when_the_consumer_stops(
        mesh: Mesh) -> None:
    """Iteration waits for records with no deadline of its own: stop() must end it."""
    topic = unique("iter")
    async with Producer(namesrv=mesh.namesrv) as producer:
        await asyncio.gather(*[await producer.send(topic, b"%d" % i) for i in range(20)])
    consumer = Consumer(topic, group=unique("g"), namesrv=mesh.namesrv,
                        auto_offset_reset="earliest", **FAST)
    await consumer.start()
    got: list[bytes] = []
    twenty = asyncio.Event()

    async def iterate() -> None:
        async for rec in consumer:
            got.append(rec.body)
            if len(got) == 20:
                twenty.set()

    task = asyncio.create_task(iterate())
    await asyncio.wait_for(twenty.wait(), 30)
    await asyncio.sleep(0.2)   # parked in the iteration, nothing left to yield
    await consumer.stop()
    await asyncio.wait_for(task, 5)   # ended by StopAsyncIteration, not cancelled
    assert sorted(got) == sorted(b"%d" % i for i in range(20))
