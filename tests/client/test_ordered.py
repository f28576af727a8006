"""Ordered consumption against a real mesh (etcd, namesrv, two brokers with 4 queues each).

The brokers' lock expiry is 3 s here (FERRY_BROKER_LOCK_EXPIRY_MS), so members
renew every second and a lock lapses locally after 1.5 s without renewal.
"""
from __future__ import annotations

import asyncio
import os
import signal
from typing import Any

import pytest
from ferry.client import Admin, Consumer, ConsumerRecord, Producer, TopicQueue
from ferry.client.core.connection import ConnectionPool
from ferry.wire import RequestCode

from tests.client.conftest import Mesh, unique
from tests.client.ordered_support import ORDERED, lock_mesh, make_queues, until
from tests.client.util import FAST

pytestmark = pytest.mark.integration
__all__ = ["lock_mesh"]   # the fixture (ordered_support), imported so pytest finds it

def _on(queue: TopicQueue) -> Any:
    return lambda qs, msg: next(q for q in qs if q == queue)


async def test_a_failing_message_blocks_its_queue_only_then_goes_to_the_dlq(
        lock_mesh: Mesh) -> None:
    topic, group = unique("ord-fail"), unique("g")
    queues = await make_queues(lock_mesh, topic)
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
    queues = await make_queues(lock_mesh, topic)
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




async def test_a_member_that_cannot_renew_stops_handing_out_that_queue(lock_mesh: Mesh) -> None:
    topic, group = unique("ord-lapse"), unique("g")
    queues = await make_queues(lock_mesh, topic)
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
            await until(lambda: stuck not in consumer.assignment(), 10,
                         "the queue of the silent broker is dropped")
            let_go.set()   # the record in flight finishes; the rest stays where it is
            await asyncio.sleep(0.5)
            assert [b for b in bodies if b.startswith("b")] == ["b-0"]
            assert flowing in consumer.assignment()
        finally:
            os.kill(broker.pid, signal.SIGCONT)
        # Answering again: locked anew and served from the committed position.
        await until(lambda: {f"b-{i}" for i in range(5)} <= set(bodies), 30,
                     "the queue is served again")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    firsts = list(dict.fromkeys(b for b in bodies if b.startswith("b")))
    assert firsts == [f"b-{i}" for i in range(5)]
    assert [b for b in bodies if b.startswith("a")] == [f"a-{i}" for i in range(5)]


async def test_run_ordered_turns_ordered_mode_on_for_a_plain_consumer(lock_mesh: Mesh) -> None:
    topic, group = unique("ord-turn"), unique("g")
    queues = await make_queues(lock_mesh, topic)
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
        await until(lambda: len(got) >= 10, 20, "all ten handled")
        assert consumer.ordered
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert got == [f"m-{i}" for i in range(10)] and not overlapped
    async with Consumer(topic, group=group, namesrv=lock_mesh.namesrv, **ORDERED) as ordered:
        with pytest.raises(ValueError, match="ordered"):
            await ordered.run(handler, ordered=False)
