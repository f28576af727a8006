"""The clients against real namesrv and broker processes (two brokers, one etcd)."""
from __future__ import annotations

import asyncio
import time
from collections import defaultdict

import pytest
from ferry import Admin, Consumer, Message, Producer, TopicQueue

from tests.client.conftest import Mesh, unique
from tests.client.util import FAST, collect, wait_assignment

pytestmark = pytest.mark.integration


async def _all_queues(mesh: Mesh, topic: str) -> set[TopicQueue]:
    async with Admin(namesrv=mesh.namesrv) as admin:
        return {i.tq for i in await admin.queue_infos(topic)}


async def test_produce_and_consume_through_two_brokers(mesh: Mesh) -> None:
    topic = unique("basic")
    async with Producer(namesrv=mesh.namesrv) as producer:
        futs = [await producer.send(topic, f"m{i}".encode(), key=f"k{i}", tags="t",
                                    properties={"n": str(i)}) for i in range(200)]
        results = await asyncio.gather(*futs)
    assert {r.broker for r in results} == set(mesh.brokers)
    where = {r.msg_id: r for r in results}
    assert len(where) == 200
    async with Consumer(topic, group=unique("g"), namesrv=mesh.namesrv,
                        auto_offset_reset="earliest", **FAST) as consumer:
        got = (await collect([consumer], 200))[0]
    assert sorted(r.body for r in got) == sorted(f"m{i}".encode() for i in range(200))
    for rec in got:
        sent = where[rec.msg_id]
        assert (rec.broker, rec.queue_id, rec.queue_offset) == \
            (sent.broker, sent.queue_id, sent.queue_offset)
        n = int(rec.properties["n"])
        assert rec.body == f"m{n}".encode() and rec.key == f"k{n}" and rec.tags == "t"
        assert rec.store_ts_ms >= rec.born_ts_ms - 1000


async def test_send_batch_and_send_oneway(mesh: Mesh) -> None:
    topic = unique("batch")
    async with Producer(namesrv=mesh.namesrv) as producer:
        results = await producer.send_batch(topic, [Message(f"b{i}".encode()) for i in range(10)])
        assert len({r.topic_queue for r in results}) == 1
        assert [r.queue_offset for r in results] == list(range(results[0].queue_offset,
                                                                results[0].queue_offset + 10))
        producer.send_oneway(topic, b"oneway")
        await producer.flush()
    async with Consumer(topic, group=unique("g"), namesrv=mesh.namesrv,
                        auto_offset_reset="earliest", **FAST) as consumer:
        got = (await collect([consumer], 11, timeout_s=15))[0]
    assert sorted(r.body for r in got) == sorted([f"b{i}".encode() for i in range(10)]
                                                 + [b"oneway"])


async def test_ordered_per_key(mesh: Mesh) -> None:
    topic = unique("ordered")
    keys = [f"order-{i}" for i in range(6)]
    async with Producer(namesrv=mesh.namesrv) as producer:
        futs = []
        for seq in range(40):
            for key in keys:
                futs.append(await producer.send(topic, f"{key}:{seq}".encode(), key=key,
                                                ordered=True))
        results = await asyncio.gather(*futs)
    queue_of_key: dict[str, set[TopicQueue]] = defaultdict(set)
    for r, i in zip(results, range(len(results)), strict=True):
        queue_of_key[keys[i % len(keys)]].add(r.topic_queue)
    assert all(len(q) == 1 for q in queue_of_key.values())
    async with Consumer(topic, group=unique("g"), namesrv=mesh.namesrv,
                        auto_offset_reset="earliest", **FAST) as consumer:
        got = (await collect([consumer], 240))[0]
    seqs: dict[str, list[int]] = defaultdict(list)
    for rec in got:
        key, seq = rec.body.decode().split(":")
        seqs[key].append(int(seq))
    assert {k: v for k, v in seqs.items()} == {k: list(range(40)) for k in keys}


async def test_clustering_group_of_three_gets_each_message_once(mesh: Mesh) -> None:
    topic, group = unique("cluster"), unique("g")
    async with Admin(namesrv=mesh.namesrv) as admin:
        await admin.create_topic(topic, queues=4)
    queues = await _all_queues(mesh, topic)
    assert len(queues) == 8
    consumers = [Consumer(topic, group=group, namesrv=mesh.namesrv,
                          auto_offset_reset="earliest", **FAST) for _ in range(3)]
    try:
        for c in consumers:
            await c.start()
        await wait_assignment(consumers, queues)
        shares = [c.assignment() for c in consumers]
        assert sorted(len(s) for s in shares) == [2, 3, 3]
        async with Producer(namesrv=mesh.namesrv) as producer:
            futs = [await producer.send(topic, f"c{i}".encode()) for i in range(300)]
            await asyncio.gather(*futs)
        got = await collect(consumers, 300, settle_s=1.0)
    finally:
        for c in consumers:
            await c.stop()
    bodies = [r.body for recs in got.values() for r in recs]
    assert len(bodies) == 300 and len(set(bodies)) == 300
    for i, recs in got.items():
        assert all(r.topic_queue in shares[i] for r in recs)
    assert all(got[i] for i in got)  # the load is spread


async def test_broadcasting_delivers_everything_to_every_member(mesh: Mesh, tmp_path) -> None:  # type: ignore[no-untyped-def]
    topic, group = unique("bcast"), unique("g")
    async with Admin(namesrv=mesh.namesrv) as admin:
        await admin.create_topic(topic, queues=2)
    consumers = [Consumer(topic, group=group, namesrv=mesh.namesrv, mode="broadcasting",
                          offset_store_path=tmp_path / f"offsets-{i}.json", **FAST)
                 for i in range(3)]
    try:
        for c in consumers:
            await c.start()
        queues = await _all_queues(mesh, topic)
        assert all(c.assignment() == queues for c in consumers)
        async with Producer(namesrv=mesh.namesrv) as producer:
            futs = [await producer.send(topic, f"b{i}".encode()) for i in range(50)]
            await asyncio.gather(*futs)
        got = await collect(consumers, 150, settle_s=0.5)
    finally:
        for c in consumers:
            await c.stop()
    for recs in got.values():
        assert sorted(r.body for r in recs) == sorted(f"b{i}".encode() for i in range(50))
    assert (tmp_path / "offsets-0.json").exists()
    # a restarted broadcasting member resumes from its own file: nothing again
    async with Consumer(topic, group=group, namesrv=mesh.namesrv, mode="broadcasting",
                        offset_store_path=tmp_path / "offsets-0.json", **FAST) as again:
        assert await again.getmany(timeout_ms=1500) == {}


async def test_offsets_for_times_and_seek(mesh: Mesh) -> None:
    topic = unique("seek")
    async with Admin(namesrv=mesh.namesrv) as admin:
        await admin.create_topic(topic, queues=1, brokers=["broker-a"])
    async with Producer(namesrv=mesh.namesrv) as producer:
        first = [await producer.send_and_wait(topic, f"old{i}".encode()) for i in range(5)]
        await asyncio.sleep(0.05)
        middle_ms = int(time.time() * 1000)
        await asyncio.sleep(0.05)
        second = [await producer.send_and_wait(topic, f"new{i}".encode()) for i in range(5)]
    tq = first[0].topic_queue
    assert {r.topic_queue for r in first + second} == {tq}
    async with Consumer(topic, group=unique("g"), namesrv=mesh.namesrv,
                        auto_offset_reset="latest", **FAST) as consumer:
        assert consumer.assignment() == {tq}
        assert await consumer.getmany(timeout_ms=300) == {}   # latest: nothing old
        offsets = await consumer.offsets_for_times({tq: middle_ms})
        assert offsets == {tq: second[0].queue_offset}
        await consumer.seek(tq, offsets[tq])
        got = (await collect([consumer], 5, timeout_s=10))[0]
        assert [r.body for r in got] == [f"new{i}".encode() for i in range(5)]
        await consumer.seek_to_beginning()
        got = (await collect([consumer], 10, timeout_s=10))[0]
        assert [r.body for r in got][:5] == [f"old{i}".encode() for i in range(5)]
        await consumer.seek_to_end()
        assert consumer.position(tq) == second[-1].queue_offset + 1


async def test_commit_and_group_lag(mesh: Mesh) -> None:
    topic, group = unique("lag"), unique("g")
    async with Producer(namesrv=mesh.namesrv) as producer:
        futs = [await producer.send(topic, b"x") for _ in range(20)]
        await asyncio.gather(*futs)
    async with Consumer(topic, group=group, namesrv=mesh.namesrv, auto_offset_reset="earliest",
                        enable_auto_commit=False, **FAST) as consumer:
        got = (await collect([consumer], 20))[0]
        assert len(got) == 20
        await consumer.commit()
    async with Admin(namesrv=mesh.namesrv) as admin:
        lags = await admin.group_lag(group, [topic])
    assert sum(q.lag for q in lags) == 0 and sum(q.max_offset for q in lags) == 20
    async with Producer(namesrv=mesh.namesrv) as producer:
        await producer.send_and_wait(topic, b"more")
    async with Admin(namesrv=mesh.namesrv) as admin:
        assert sum(q.lag for q in await admin.group_lag(group, [topic])) == 1
    # a new consumer of the group starts at the committed offsets: only the new message
    async with Consumer(topic, group=group, namesrv=mesh.namesrv, **FAST) as consumer:
        got = (await collect([consumer], 1, timeout_s=10, settle_s=0.5))[0]
    assert [r.body for r in got] == [b"more"]


def test_a_round_trip_under_uvloop(mesh: Mesh) -> None:
    """The clients run under uvloop too (docs/client.md): plain sends (the fast path), a
    batch and a keyed message, consumed back exactly where their SendResults say."""
    uvloop = pytest.importorskip("uvloop")
    topic = unique("uvloop")

    async def round_trip() -> None:
        assert type(asyncio.get_running_loop()).__module__.startswith("uvloop")
        async with Producer(namesrv=mesh.namesrv) as producer:
            futs = [await producer.send(topic, f"p{i}".encode()) for i in range(100)]
            assert all(isinstance(f, asyncio.Future) for f in futs)
            sent = list(await asyncio.gather(*futs))
            sent += await producer.send_batch(topic, [Message(f"b{i}".encode())
                                                      for i in range(20)])
            sent.append(await producer.send_and_wait(topic, b"keyed", key="k", tags="t"))
        where = {r.msg_id: r for r in sent}
        assert len(where) == 121
        async with Consumer(topic, group=unique("g"), namesrv=mesh.namesrv,
                            auto_offset_reset="earliest", **FAST) as consumer:
            got = (await collect([consumer], 121))[0]
        assert sorted(r.body for r in got) == sorted(
            [f"p{i}".encode() for i in range(100)] + [f"b{i}".encode() for i in range(20)]
            + [b"keyed"])
        for rec in got:
            r = where[rec.msg_id]
            assert (rec.broker, rec.queue_id, rec.queue_offset) == \
                (r.broker, r.queue_id, r.queue_offset)

    uvloop.run(round_trip())
