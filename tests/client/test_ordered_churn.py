"""Per-key order while members come and go, against a real mesh (etcd, namesrv, two
brokers with 4 queues each, locks expiring after 3 s): members joining and leaving,
a member killed with -9 (a child process), a broker restarted."""
from __future__ import annotations

import asyncio
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest
from ferry.client import Consumer, ConsumerRecord, Producer

from tests.client.conftest import Mesh, start_mesh, unique
from tests.client.ordered_support import (
    CHILD,
    LOCK_ENV,
    ORDERED,
    Checker,
    first_delivery_violations,
    lock_mesh,
    make_queues,
    until,
)
from tests.support.procs import Etcd, spawn

pytestmark = pytest.mark.integration
__all__ = ["lock_mesh"]   # the fixture, imported
async def test_per_key_order_and_no_shared_queue_while_members_join_and_leave(
        lock_mesh: Mesh) -> None:
    topic, group = unique("ord-keys"), unique("g")
    await make_queues(lock_mesh, topic)
    keys, rounds = [f"k{i}" for i in range(20)], 40
    checker = Checker()
    opts = {**ORDERED, "lock_renew_interval_ms": 1000}

    async def send_all() -> None:
        async with Producer(namesrv=lock_mesh.namesrv) as producer:
            for seq in range(rounds):
                for key in keys:
                    await producer.send_and_wait(topic, f"{key}:{seq}".encode(), key=key,
                                                 ordered=True)
                await asyncio.sleep(0.15)

    members = {name: Consumer(topic, group=group, namesrv=lock_mesh.namesrv,
                              client_id=f"{group}-{name}", **opts) for name in "abc"}
    runs: dict[str, asyncio.Future[None]] = {}

    async def join(name: str) -> None:
        await members[name].start()
        runs[name] = asyncio.ensure_future(
            members[name].run(checker.handler(name), concurrency=4))

    try:
        await join("a")
        await join("b")
        sender = asyncio.ensure_future(send_all())
        await asyncio.sleep(1.5)
        await join("c")           # a member joins mid-stream
        await asyncio.sleep(2.0)
        await members["a"].stop()  # one leaves mid-stream (clean stop)
        await asyncio.wait_for(runs["a"], 10)
        await asyncio.wait_for(sender, 60)
        want = {(k, s) for k in keys for s in range(rounds)}
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 60
        while {(k, s) for _, k, s in checker.deliveries} != want and loop.time() < deadline:
            await asyncio.sleep(0.2)
    finally:
        for consumer in members.values():
            await consumer.stop()
        for run in runs.values():
            await asyncio.wait_for(run, 10)
    assert {(k, s) for _, k, s in checker.deliveries} == want
    assert checker.overlaps == []
    assert checker.order_violations() == []
    by_member: dict[str, int] = defaultdict(int)
    for member, _, _ in checker.deliveries:
        by_member[member] += 1
    assert set(by_member) == {"a", "b", "c"}   # all three took part


async def test_per_key_order_holds_when_a_member_is_killed(lock_mesh: Mesh,
                                                           tmp_path: Path) -> None:
    topic, group = unique("ord-kill"), unique("g")
    await make_queues(lock_mesh, topic)
    keys, rounds = [f"k{i}" for i in range(20)], 30
    out = tmp_path / "child.log"
    child = spawn("ordered-child", [sys.executable, str(CHILD), lock_mesh.namesrv, topic, group,
                                    str(out)], tmp_path / "child")
    calls: list[tuple[int, str, int]] = []

    async def handler(rec: ConsumerRecord) -> None:
        if rec.tags == "warm-up":
            return
        key, seq = rec.body.decode().split(":")
        calls.append((time.time_ns(), key, int(seq)))
        await asyncio.sleep(0.003)

    def child_calls() -> list[tuple[int, str, int]]:
        rows = []
        for line in out.read_text().splitlines() if out.exists() else ():
            ts, *_, body = line.split()
            key, seq = body.split(":")
            rows.append((int(ts), key, int(seq)))
        return rows

    try:
        async with Consumer(topic, group=group, namesrv=lock_mesh.namesrv, **ORDERED) as me:
            task = asyncio.ensure_future(me.run(handler, concurrency=8))
            async with Producer(namesrv=lock_mesh.namesrv) as producer:
                for seq in range(rounds):
                    for key in keys:
                        await producer.send_and_wait(topic, f"{key}:{seq}".encode(), key=key,
                                                     ordered=True)
                    if seq == rounds // 2:
                        await until(lambda: len(child_calls()) > 0, 60, "the child consumes")
                        child.kill9()   # mid-stream, with records in its handlers
                    await asyncio.sleep(0.05)
            want = {(k, s) for k in keys for s in range(rounds)}
            await until(lambda: {(k, s) for _, k, s in calls + child_calls()} == want, 60,
                         "every message delivered")
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
    finally:
        child.kill9()
    assert child_calls(), "the killed member took part"
    assert first_delivery_violations(calls + child_calls()) == []


async def test_per_key_order_holds_through_a_broker_restart(etcd: Etcd, tmp_path: Path) -> None:
    """Locks live in the broker's memory: after a kill -9 and restart members lock again."""
    mesh = start_mesh(etcd, tmp_path / "mesh", broker_env=LOCK_ENV)
    try:
        topic, group = unique("ord-restart"), unique("g")
        await make_queues(mesh, topic)
        keys, rounds = [f"k{i}" for i in range(12)], 30
        calls: list[tuple[int, str, int]] = []

        async def handler(rec: ConsumerRecord) -> None:
            if rec.tags != "warm-up":
                key, seq = rec.body.decode().split(":")
                calls.append((time.time_ns(), key, int(seq)))

        async def send(producer: Producer, key: str, seq: int) -> None:
            for _ in range(100):   # its broker may be down: the same queue, again
                try:
                    await producer.send_and_wait(topic, f"{key}:{seq}".encode(), key=key,
                                                 ordered=True)
                    return
                except Exception:
                    await asyncio.sleep(0.2)
            raise AssertionError(f"{key}:{seq} never stored")

        members = [Consumer(topic, group=group, namesrv=mesh.namesrv,
                            client_id=f"{group}-{i}", **ORDERED) for i in range(2)]
        for m in members:
            await m.start()
        runs = [asyncio.ensure_future(m.run(handler, concurrency=8)) for m in members]
        try:
            async with Producer(namesrv=mesh.namesrv) as producer:
                for seq in range(rounds):
                    await asyncio.gather(*(send(producer, key, seq) for key in keys))
                    if seq == rounds // 3:
                        mesh.brokers["broker-a"].proc.kill9()
                        await asyncio.sleep(1.0)
                        await asyncio.to_thread(mesh.start_broker, "broker-a")
                    await asyncio.sleep(0.05)
            want = {(k, s) for k in keys for s in range(rounds)}
            await until(lambda: {(k, s) for _, k, s in calls} >= want, 90,
                         "every message delivered")
        finally:
            for m in members:
                await m.stop()
            for run in runs:
                await asyncio.wait_for(run, 10)
        assert first_delivery_violations(calls) == []
    finally:
        mesh.stop()
