"""Membership changes and broker crashes, against real processes (a fresh mesh per test)."""
from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest
from ferry import Admin, Consumer, Producer, TopicQueue
from ferry.errors import FerryError

from tests.client.conftest import Mesh, unique
from tests.client.util import FAST, collect, wait_assignment
from tests.support.procs import spawn

pytestmark = [pytest.mark.integration, pytest.mark.slow]

CHILD = Path(__file__).with_name("consumer_child.py")


async def _queues(mesh: Mesh, topic: str) -> set[TopicQueue]:
    async with Admin(namesrv=mesh.namesrv) as admin:
        return {i.tq for i in await admin.queue_infos(topic)}


async def _produce(mesh: Mesh, topic: str, prefix: str, n: int) -> None:
    async with Producer(namesrv=mesh.namesrv) as producer:
        futs = [await producer.send(topic, f"{prefix}{i}".encode()) for i in range(n)]
        await asyncio.gather(*futs)


def _child_bodies(path: Path) -> list[str]:
    if not path.exists():
        return []
    return [line.split(" ", 3)[3] for line in path.read_text().splitlines()
            if not line.startswith("assigned") and line.count(" ") >= 3]


async def test_join_graceful_leave_and_crash_move_queues_without_loss(
        fresh_mesh: Mesh, tmp_path: Path) -> None:
    mesh = fresh_mesh
    topic, group = unique("members"), unique("g")
    async with Admin(namesrv=mesh.namesrv) as admin:
        await admin.create_topic(topic, queues=4)
    queues = await _queues(mesh, topic)
    a = Consumer(topic, group=group, namesrv=mesh.namesrv, auto_offset_reset="earliest", **FAST)
    b = Consumer(topic, group=group, namesrv=mesh.namesrv, auto_offset_reset="earliest", **FAST)
    seen: dict[str, list[str]] = {"a": [], "b": []}
    await a.start()
    try:
        await wait_assignment([a], queues)
        await _produce(mesh, topic, "p1-", 100)
        seen["a"] += [r.body.decode() for r in (await collect([a], 100))[0]]

        # join: b takes half of the queues within a few rebalance intervals
        await b.start()
        await wait_assignment([a, b], queues)
        assert len(a.assignment()) == len(b.assignment()) == 4
        await _produce(mesh, topic, "p2-", 100)
        got = await collect([a, b], 100, settle_s=0.5)
        seen["a"] += [r.body.decode() for r in got[0]]
        seen["b"] += [r.body.decode() for r in got[1]]

        # graceful leave: a commits and unregisters; b gets everything
        await a.stop()
        await wait_assignment([b], queues)
        await _produce(mesh, topic, "p3-", 100)
        seen["b"] += [r.body.decode() for r in (await collect([b], 100))[0]]

        # crash: a child consumer joins, takes queues, and is SIGKILLed
        out = tmp_path / "child.out"
        child = spawn("child", [sys.executable, str(CHILD), mesh.namesrv, topic, group,
                                str(out)], tmp_path)
        try:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 20
            while len(b.assignment()) != 4:
                assert loop.time() < deadline, "the child never took its share"
                await b.getmany(timeout_ms=100)
            await _produce(mesh, topic, "p4-", 100)
            got_b = (await collect([b], 50, timeout_s=15, settle_s=1.0))[0]
            seen["b"] += [r.body.decode() for r in got_b]
        finally:
            child.kill9()
        # the broker forgets the dead member (6 s in this mesh); b takes every queue back
        await wait_assignment([b], queues, timeout_s=30)
        await _produce(mesh, topic, "p5-", 100)
        seen["b"] += [r.body.decode() for r in (await collect([b], 100, settle_s=2.0))[0]]
    finally:
        await a.stop()
        await b.stop()
    everything = set(seen["a"]) | set(seen["b"]) | set(_child_bodies(tmp_path / "child.out"))
    expected = {f"p{k}-{i}" for k in range(1, 6) for i in range(100)}
    assert expected <= everything, f"lost: {sorted(expected - everything)[:10]}"
    # b received what the child took but never committed (at-least-once), and the rest
    assert {f"p5-{i}" for i in range(100)} <= set(seen["b"])


async def test_producer_fails_over_when_a_broker_is_killed(fresh_mesh: Mesh) -> None:
    mesh = fresh_mesh
    topic = unique("failover")
    acked: list[str] = []
    failed = 0
    async with Producer(namesrv=mesh.namesrv, request_timeout_ms=2000) as producer:
        for i in range(50):
            acked.append((await producer.send_and_wait(topic, f"before{i}".encode())).msg_id)
        mesh.brokers["broker-a"].proc.kill9()
        for i in range(300):
            fut = await producer.send(topic, f"after{i}".encode())
            try:
                result = await fut
            except FerryError:
                failed += 1
                continue
            acked.append(result.msg_id)
            assert result.broker == "broker-b" or i < 3
    assert failed == 0
    # bring broker-a back on its port and data: every acknowledged message is there
    mesh.start_broker("broker-a")
    async with Consumer(topic, group=unique("g"), namesrv=mesh.namesrv,
                        auto_offset_reset="earliest", **FAST) as consumer:
        got = (await collect([consumer], len(acked), timeout_s=30))[0]
    ids = {r.msg_id for r in got}
    missing = set(acked) - ids
    assert not missing, f"{len(missing)} acknowledged messages lost"


async def test_default_intervals_move_queues_within_20_s(mesh: Mesh) -> None:
    """With the default heartbeat/rebalance periods (5 s): join and graceful leave."""
    topic, group = unique("timing"), unique("g")
    async with Admin(namesrv=mesh.namesrv) as admin:
        await admin.create_topic(topic, queues=2)
    queues = await _queues(mesh, topic)
    a = Consumer(topic, group=group, namesrv=mesh.namesrv)
    b = Consumer(topic, group=group, namesrv=mesh.namesrv)
    loop = asyncio.get_running_loop()
    try:
        await a.start()
        assert a.assignment() == queues          # the first rebalance runs inside start()
        t0 = loop.time()
        await b.start()
        await wait_assignment([a, b], queues, timeout_s=20)
        joined_s = loop.time() - t0
        t0 = loop.time()
        await b.stop()
        await wait_assignment([a], queues, timeout_s=20)
        left_s = loop.time() - t0
    finally:
        await a.stop()
        await b.stop()
    assert joined_s < 20 and left_s < 20
