"""Ordered consumption against a real mesh (etcd, namesrv, two brokers with 4 queues each).

The brokers' lock expiry is 3 s here (FERRY_BROKER_LOCK_EXPIRY_MS), so members
renew every second and a lock lapses locally after 1.5 s without renewal.
"""
from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from ferry.client import Admin, Consumer, ConsumerRecord, Producer, TopicQueue
from ferry.client.core.connection import ConnectionPool
from ferry.client.core.namesrv import NamesrvClient
from ferry.wire import RequestCode

from tests.client.conftest import Mesh, start_mesh, unique
from tests.client.util import FAST
from tests.support.procs import Etcd, spawn

pytestmark = pytest.mark.integration

CHILD = Path(__file__).with_name("ordered_child.py")

LOCK_ENV = {"FERRY_BROKER_LOCK_EXPIRY_MS": "3000", "FERRY_BROKER_CONSUMER_EXPIRY_MS": "6000"}
ORDERED: dict[str, Any] = {**FAST, "ordered": True, "auto_offset_reset": "earliest"}


@pytest.fixture(scope="module")
def lock_mesh(etcd: Etcd, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mesh]:
    m = start_mesh(etcd, tmp_path_factory.mktemp("ordered"), broker_env=LOCK_ENV)
    yield m
    m.stop()


async def _queues(mesh: Mesh, topic: str) -> list[TopicQueue]:
    """Create `topic` (first send) and return its queues, sorted."""
    async with Producer(namesrv=mesh.namesrv) as producer:
        await producer.send_and_wait(topic, b"warm-up", tags="warm-up")
    namesrv = NamesrvClient(mesh.namesrv)
    await namesrv.start()
    try:
        route = await namesrv.get_route(topic)
    finally:
        await namesrv.close()
    return sorted(TopicQueue(topic, b, q) for b, q in route.readable_queues())


def _on(queue: TopicQueue) -> Any:
    return lambda qs, msg: next(q for q in qs if q == queue)


async def test_a_failing_message_blocks_its_queue_only_then_goes_to_the_dlq(
        lock_mesh: Mesh) -> None:
    topic, group = unique("ord-fail"), unique("g")
    queues = await _queues(lock_mesh, topic)
    bad_q, others = queues[0], queues[1:]
    async with Producer(namesrv=lock_mesh.namesrv) as producer:
        poison = await producer.send_and_wait(topic, b"poison", ordered=True,
                                              queue_selector=_on(bad_q))
        for i in (1, 2):
            await producer.send_and_wait(topic, f"after-{i}".encode(), ordered=True,
                                         queue_selector=_on(bad_q))
        for q in others:
            for i in range(3):
                await producer.send_and_wait(topic, f"other-{q.queue_id}-{i}".encode(),
                                             ordered=True, queue_selector=_on(q))
    calls: list[tuple[str, int, TopicQueue]] = []
    done = asyncio.Event()

    async def handler(rec: ConsumerRecord) -> None:
        if rec.tags == "warm-up":
            return
        calls.append((rec.body.decode(), rec.reconsume_times, rec.topic_queue))
        if rec.body == b"poison":
            raise RuntimeError("cannot handle this one")
        if rec.body == b"after-2":
            done.set()

    async with Consumer(topic, group=group, namesrv=lock_mesh.namesrv, max_reconsume_times=2,
                        suspend_ms=1000, **ORDERED) as consumer:
        task = asyncio.ensure_future(consumer.run(handler, concurrency=8))
        await asyncio.wait_for(done.wait(), 30)
        await asyncio.sleep(0.5)   # nothing more comes
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await consumer.commit()

    bodies = [body for body, _, _ in calls]
    poison_calls = [(i, times) for i, (body, times, _) in enumerate(calls) if body == "poison"]
    assert [times for _, times in poison_calls] == [0, 1, 2]   # then the DLQ, not a 4th call
    last_poison = poison_calls[-1][0]
    # The other queues flowed while the poison waited out its suspends...
    assert all(bodies.index(f"other-{q.queue_id}-{i}") < last_poison
               for q in others for i in range(3))
    assert sorted(b for b in bodies if b.startswith("other")) == sorted(
        f"other-{q.queue_id}-{i}" for q in others for i in range(3))
    # ...and its own queue went on, in order, only after it was dead-lettered.
    assert bodies[last_poison + 1:].count("after-1") == 1
    assert [b for b in bodies if b.startswith("after")] == ["after-1", "after-2"]
    assert bodies.index("after-1") > last_poison
    for q in others:   # each queue in offset order
        assert [b for b, _, tq in calls if tq == q] == [f"other-{q.queue_id}-{i}"
                                                         for i in range(3)]
    async with Admin(namesrv=lock_mesh.namesrv) as admin:
        dead = await admin.dead_letters(group).messages()
    assert [(r.msg_id, r.reconsume_times) for r in dead] == [(poison.msg_id, 3)]
    # Committed past everything, the poison included: the group gets nothing again.
    async with Consumer(topic, group=group, namesrv=lock_mesh.namesrv, **ORDERED) as again:
        await asyncio.sleep(1.5)
        assert await again.getmany(timeout_ms=1000) == {}


async def test_a_queue_locked_by_another_member_is_not_served_until_unlocked(
        lock_mesh: Mesh) -> None:
    topic, group = unique("ord-lock"), unique("g")
    queues = await _queues(lock_mesh, topic)
    taken = queues[0]
    addr = lock_mesh.brokers[taken.broker].addr
    fields = {"group": group, "client_id": "intruder", "topic": topic,
              "queue_ids": [taken.queue_id]}
    async with Producer(namesrv=lock_mesh.namesrv) as producer:
        for q in queues:
            await producer.send_and_wait(topic, f"m-{q}".encode(), ordered=True,
                                         queue_selector=_on(q))
    pool = ConnectionPool()
    try:
        resp = await pool.request(addr, RequestCode.LOCK, fields)
        assert resp.fields["locked"] == [taken.queue_id]
        got: list[ConsumerRecord] = []
        async with Consumer(topic, group=group, namesrv=lock_mesh.namesrv, **ORDERED) as c:
            assert c.ordered
            loop = asyncio.get_running_loop()
            until = loop.time() + 4   # longer than the lock expiry: the intruder renews it
            while loop.time() < until:
                await pool.request(addr, RequestCode.LOCK, fields)
                for records in (await c.getmany(timeout_ms=300)).values():
                    got.extend(r for r in records if r.tags != "warm-up")
            assert {r.topic_queue for r in got} == set(queues) - {taken}
            assert taken not in c.assignment()
            await pool.request(addr, RequestCode.UNLOCK, fields)
            until = loop.time() + 15
            while loop.time() < until and taken not in {r.topic_queue for r in got}:
                for records in (await c.getmany(timeout_ms=300)).values():
                    got.extend(r for r in records if r.tags != "warm-up")
        assert [r.body.decode() for r in got if r.topic_queue == taken] == [f"m-{taken}"]
    finally:
        await pool.close()


async def _until(check: Any, timeout_s: float, what: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not check():
        if loop.time() > deadline:
            raise AssertionError(f"never: {what}")
        await asyncio.sleep(0.05)


async def test_a_member_that_cannot_renew_stops_handing_out_that_queue(lock_mesh: Mesh) -> None:
    topic, group = unique("ord-lapse"), unique("g")
    queues = await _queues(lock_mesh, topic)
    stuck = next(q for q in queues if q.broker == "broker-b")
    flowing = next(q for q in queues if q.broker == "broker-a")
    async with Producer(namesrv=lock_mesh.namesrv) as producer:
        for i in range(5):
            await producer.send_and_wait(topic, f"b-{i}".encode(), ordered=True,
                                         queue_selector=_on(stuck))
            await producer.send_and_wait(topic, f"a-{i}".encode(), ordered=True,
                                         queue_selector=_on(flowing))
    bodies: list[str] = []
    first_in, let_go = asyncio.Event(), asyncio.Event()

    async def handler(rec: ConsumerRecord) -> None:
        if rec.tags == "warm-up":
            return
        bodies.append(rec.body.decode())
        if rec.body == b"b-0" and not let_go.is_set():
            first_in.set()
            await let_go.wait()

    broker = lock_mesh.brokers["broker-b"].proc.popen
    async with Consumer(topic, group=group, namesrv=lock_mesh.namesrv, **ORDERED) as consumer:
        task = asyncio.ensure_future(consumer.run(handler, concurrency=8))
        await asyncio.wait_for(first_in.wait(), 20)
        os.kill(broker.pid, signal.SIGSTOP)   # broker-b stops answering: no renewal
        try:
            await _until(lambda: stuck not in consumer.assignment(), 10,
                         "the queue of the silent broker is dropped")
            let_go.set()   # the record in flight finishes; the rest stays where it is
            await asyncio.sleep(0.5)
            assert [b for b in bodies if b.startswith("b")] == ["b-0"]
            assert flowing in consumer.assignment()
        finally:
            os.kill(broker.pid, signal.SIGCONT)
        # Answering again: locked anew and served from the committed position.
        await _until(lambda: {f"b-{i}" for i in range(5)} <= set(bodies), 30,
                     "the queue is served again")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    firsts = list(dict.fromkeys(b for b in bodies if b.startswith("b")))
    assert firsts == [f"b-{i}" for i in range(5)]
    assert [b for b in bodies if b.startswith("a")] == [f"a-{i}" for i in range(5)]


async def test_run_ordered_turns_ordered_mode_on_for_a_plain_consumer(lock_mesh: Mesh) -> None:
    topic, group = unique("ord-turn"), unique("g")
    queues = await _queues(lock_mesh, topic)
    async with Producer(namesrv=lock_mesh.namesrv) as producer:
        for i in range(10):
            await producer.send_and_wait(topic, f"m-{i}".encode(), ordered=True,
                                         queue_selector=_on(queues[0]))
    got: list[str] = []
    in_handler = 0
    overlapped = False

    async def handler(rec: ConsumerRecord) -> None:
        nonlocal in_handler, overlapped
        if rec.tags == "warm-up":
            return
        in_handler += 1
        overlapped |= in_handler > 1   # one queue: never two of its records at once
        got.append(rec.body.decode())
        await asyncio.sleep(0.01)
        in_handler -= 1

    async with Consumer(topic, group=group, namesrv=lock_mesh.namesrv, auto_offset_reset="earliest",
                        **FAST) as consumer:
        assert not consumer.ordered
        task = asyncio.ensure_future(consumer.run(handler, concurrency=8, ordered=True))
        await _until(lambda: len(got) >= 10, 20, "all ten handled")
        assert consumer.ordered
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert got == [f"m-{i}" for i in range(10)] and not overlapped
    async with Consumer(topic, group=group, namesrv=lock_mesh.namesrv, **ORDERED) as ordered:
        with pytest.raises(ValueError, match="ordered"):
            await ordered.run(handler, ordered=False)


class Checker:
    """Every handler call: who ran it on which queue; overlaps of two members on one queue."""

    def __init__(self) -> None:
        self.active: dict[TopicQueue, str] = {}
        self.overlaps: list[tuple[TopicQueue, str, str]] = []
        self.deliveries: list[tuple[str, str, int]] = []   # (member, key, seq), in call order

    def handler(self, member: str) -> Any:
        async def handle(rec: ConsumerRecord) -> None:
            if rec.tags == "warm-up":
                return
            tq = rec.topic_queue
            other = self.active.get(tq)
            if other is not None:
                self.overlaps.append((tq, other, member))
            self.active[tq] = member
            key, seq = rec.body.decode().split(":")
            self.deliveries.append((member, key, int(seq)))
            try:
                await asyncio.sleep(0.003)
            finally:
                if self.active.get(tq) == member:
                    del self.active[tq]
        return handle

    def order_violations(self) -> list[tuple[str, int, int]]:
        """Per key, a first delivery of a seq below one delivered first before it."""
        highest: dict[str, int] = {}
        seen: set[tuple[str, int]] = set()
        bad = []
        for _, key, seq in self.deliveries:
            if (key, seq) in seen:
                continue   # a redelivery (at-least-once), not a first delivery
            seen.add((key, seq))
            if seq < highest.get(key, -1):
                bad.append((key, seq, highest[key]))
            highest[key] = max(seq, highest.get(key, -1))
        return bad


async def test_per_key_order_and_no_shared_queue_while_members_join_and_leave(
        lock_mesh: Mesh) -> None:
    topic, group = unique("ord-keys"), unique("g")
    await _queues(lock_mesh, topic)
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


def first_delivery_violations(calls: list[tuple[int, str, int]]) -> list[tuple[str, int, int]]:
    """Over (time_ns, key, seq) handler calls of all members: first deliveries out of order."""
    checker = Checker()
    checker.deliveries = [("", key, seq) for _, key, seq in sorted(calls)]
    return checker.order_violations()


async def test_per_key_order_holds_when_a_member_is_killed(lock_mesh: Mesh,
                                                           tmp_path: Path) -> None:
    topic, group = unique("ord-kill"), unique("g")
    await _queues(lock_mesh, topic)
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
                        await _until(lambda: len(child_calls()) > 0, 60, "the child consumes")
                        child.kill9()   # mid-stream, with records in its handlers
                    await asyncio.sleep(0.05)
            want = {(k, s) for k in keys for s in range(rounds)}
            await _until(lambda: {(k, s) for _, k, s in calls + child_calls()} == want, 60,
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
        await _queues(mesh, topic)
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
            await _until(lambda: {(k, s) for _, k, s in calls} >= want, 90,
                         "every message delivered")
        finally:
            for m in members:
                await m.stop()
            for run in runs:
                await asyncio.wait_for(run, 10)
        assert first_delivery_violations(calls) == []
    finally:
        mesh.stop()
