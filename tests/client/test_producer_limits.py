"""Ordered sends, the producer's buffer bound and group start positions, against real processes.

A broker is made unresponsive with SIGSTOP (and resumed with SIGCONT) for a
few seconds, well inside its etcd lease, so namesrv keeps routing to it: the
case where a producer must decide between moving a key and failing.
"""
from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Iterator

import pytest
from ferry import Admin, Consumer, Producer
from ferry.errors import BusyError, FerryError

from tests.client.conftest import Mesh, unique
from tests.client.util import FAST, collect
from tests.support.procs import free_port

pytestmark = [pytest.mark.integration]


@contextlib.contextmanager
def paused(mesh: Mesh, name: str) -> Iterator[None]:
    proc = mesh.brokers[name].proc
    proc.popen.send_signal(signal.SIGSTOP)
    try:
        yield
    finally:
        proc.popen.send_signal(signal.SIGCONT)


async def test_ordered_send_fails_on_its_queue_while_plain_sends_fail_over(mesh: Mesh) -> None:
    topic = unique("ordered")
    async with Admin(namesrv=mesh.namesrv) as admin:
        await admin.create_topic(topic, queues=2)
    async with Producer(namesrv=mesh.namesrv, request_timeout_ms=400,
                        retry_backoff_ms=50) as producer:
        homes = {}
        for k in range(12):
            r = await producer.send_and_wait(topic, b"first", key=f"k{k}", ordered=True)
            homes[f"k{k}"] = (r.broker, r.queue_id)
        on_a = [k for k, (b, _) in homes.items() if b == "broker-a"]
        on_b = [k for k, (b, _) in homes.items() if b == "broker-b"]
        assert on_a and on_b
        with paused(mesh, "broker-a"):
            with pytest.raises(FerryError) as info:
                await producer.send_and_wait(topic, b"second", key=on_a[0], ordered=True)
            assert info.value.retriable
            for k in on_b:   # keys of the live broker keep their queue while a is skipped
                r = await producer.send_and_wait(topic, b"second", key=k, ordered=True)
                assert (r.broker, r.queue_id) == homes[k]
            plain = await producer.send_and_wait(topic, b"plain")
            assert plain.broker == "broker-b"
        r = await producer.send_and_wait(topic, b"third", key=on_a[0], ordered=True)
        assert (r.broker, r.queue_id) == homes[on_a[0]]


async def test_buffer_full_blocks_send_then_busy_and_drains_after(mesh: Mesh) -> None:
    topic = unique("buffer")
    async with Admin(namesrv=mesh.namesrv) as admin:
        await admin.create_topic(topic, queues=2, brokers=["broker-a"])
    limit = 64 * 1024
    async with Producer(namesrv=mesh.namesrv, buffer_memory_bytes=limit, max_block_ms=300,
                        request_timeout_ms=10_000) as producer:
        await producer.send_and_wait(topic, b"warm")      # route and connection ready
        futs = []
        with paused(mesh, "broker-a"):
            loop = asyncio.get_running_loop()
            with pytest.raises(BusyError):
                for _ in range(1000):
                    t0 = loop.time()
                    futs.append(await producer.send(topic, b"x" * 1024))
            assert loop.time() - t0 >= 0.29            # it waited max_block_ms first
            assert producer.buffered_bytes <= limit and len(futs) >= 50
            assert producer.send_oneway(topic, b"y" * 1024) is False
        results = await asyncio.gather(*futs)          # resumed: everything is acknowledged
        assert len({r.msg_id for r in results}) == len(futs)
        await producer.flush()
        assert producer.buffered_bytes == 0


async def test_retry_that_finds_no_writable_queue_fails_the_send(mesh: Mesh) -> None:
    topic = unique("readonly")
    async with Admin(namesrv=mesh.namesrv) as admin:
        config = await admin.create_topic(topic, queues=2)
        async with Producer(namesrv=mesh.namesrv) as producer:
            await producer.send_and_wait(topic, b"while writable")   # the route is cached
            await admin._namesrv.call("PUT", f"/v1/topics/{topic}", json={**config, "perm": "r"})
            error = None
            for _ in range(50):   # until the brokers see the new permission
                try:
                    fut = await producer.send(topic, b"after")
                    await asyncio.wait_for(fut, 10)
                except FerryError as exc:
                    error = exc
                    break
                await asyncio.sleep(0.1)
            assert error is not None, "the topic stayed writable"
            await asyncio.wait_for(producer.flush(), 10)
            assert producer.buffered_bytes == 0


async def test_new_group_starts_where_its_config_says(mesh: Mesh) -> None:
    topic, group = unique("from"), unique("g")
    async with Admin(namesrv=mesh.namesrv) as admin:
        await admin.create_topic(topic, queues=2)
        await admin.create_group(group, consume_from="earliest")
    async with Producer(namesrv=mesh.namesrv) as producer:
        for i in range(10):
            await producer.send_and_wait(topic, f"old{i}".encode())
    async with Consumer(topic, group=group, namesrv=mesh.namesrv, **FAST) as consumer:
        assert consumer.auto_offset_reset == "earliest"
        got = (await collect([consumer], 10, timeout_s=15))[0]
    assert sorted(r.body for r in got) == sorted(f"old{i}".encode() for i in range(10))
    # no config: latest, as before
    async with Consumer(topic, group=unique("g"), namesrv=mesh.namesrv, **FAST) as consumer:
        assert consumer.auto_offset_reset == "latest"


async def test_consumer_starts_while_namesrv_is_down_and_reads_the_group_config_later() -> None:
    consumer = Consumer("t", group="g", namesrv=f"127.0.0.1:{free_port()}", **FAST)
    await consumer.start()          # no route and no group config yet: not an error
    try:
        assert consumer.auto_offset_reset is None and not consumer.assignment()
    finally:
        await consumer.stop()
