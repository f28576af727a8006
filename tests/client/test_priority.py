"""Priorities: queue levels, the producer's queue choice, and consumers draining high levels first."""
from __future__ import annotations

import asyncio
import time
from typing import NamedTuple

import pytest
from ferry import Admin, Consumer, Message, Producer
from ferry.client.consuming.fetcher import FetchConfig, QueueFetcher
from ferry.client.core.message import TopicQueue
from ferry.client.core.namesrv import BrokerRoute, TopicRoute
from ferry.client.producing.queues import QueueChooser, check_priority

from tests.client.conftest import Mesh, unique
from tests.client.util import FAST


def _route(levels: int, queues: int = 8) -> TopicRoute:
    brokers = tuple(BrokerRoute(name, "c", f"127.0.0.1:{port}", queues)
                    for name, port in (("broker-a", 1), ("broker-b", 2)))
    return TopicRoute("t", "normal", "rw", brokers, priority_levels=levels)


def test_levels_of_queues_and_priorities() -> None:
    route = _route(levels=2)
    assert [route.queue_level("broker-a", q) for q in range(8)] == [0] * 4 + [1] * 4
    assert [route.level_of_priority(p) for p in range(4)] == [0, 0, 1, 1]
    four = _route(levels=4, queues=6)
    assert [four.queue_level("broker-b", q) for q in range(6)] == [0, 0, 1, 2, 2, 3]
    assert [four.level_of_priority(p) for p in range(4)] == [0, 1, 2, 3]
    assert {_route(levels=1).queue_level("broker-a", q) for q in range(8)} == {0}
    assert TopicRoute.from_json({"topic": "t", "brokers": [], "priority_levels": 3}) \
        .priority_levels == 3
    assert TopicRoute.from_json({"topic": "t", "brokers": []}).priority_levels == 1


def test_producer_queue_choice_stays_within_the_level() -> None:
    route, chooser = _route(levels=2), QueueChooser(broker_backoff_ms=1000)
    high = {chooser.round_robin("t", route, 3) for _ in range(50)}
    low = {chooser.round_robin("t", route, 0) for _ in range(50)}
    assert {q.queue_id for q in high} == {4, 5, 6, 7} and {q.broker for q in high} == \
        {"broker-a", "broker-b"}
    assert {q.queue_id for q in low} == {0, 1, 2, 3}
    # a key keeps one queue within its level
    keyed = {chooser.by_key("t", route, "order-7", True, 2) for _ in range(10)}
    assert len(keyed) == 1 and next(iter(keyed)).queue_id >= 4
    assert chooser.by_key("t", route, "order-7", True, 0).queue_id < 4
    chooser.mark_faulty("broker-a")
    assert {chooser.round_robin("t", route, 3).broker for _ in range(10)} == {"broker-b"}
    msg = Message(b"x", priority=3)
    assert chooser.choose("t", route, msg, False, lambda qs, m: qs[-1]).queue_id == 7
    # a topic without levels ignores priorities
    plain = _route(levels=1)
    assert {chooser.round_robin("t", plain, 3).queue_id for _ in range(40)} == set(range(8))


@pytest.mark.parametrize("bad", [-1, 4, 10, 1.5, True, "3"])
def test_priority_outside_0_to_3_is_refused(bad: object) -> None:
    with pytest.raises(ValueError, match="priority"):
        check_priority(bad)  # type: ignore[arg-type]


class _Rec(NamedTuple):
    queue_offset: int


def test_take_serves_the_highest_buffered_level_of_each_broker_first() -> None:
    consumer = Consumer("t", group="g", max_poll_records=10)
    config = FetchConfig(group="g", prefetch_records=1000)
    fetchers = {}
    for broker in ("broker-a", "broker-b"):
        for qid in range(4):
            tq = TopicQueue("t", broker, qid)
            f = QueueFetcher(tq=tq, pool=None, routes=None, config=config,  # type: ignore[arg-type]
                             wakeup=asyncio.Event(), fetch_offset=0)
            fetchers[tq] = f
    consumer._fetchers = fetchers
    consumer._assignment.levels = {tq: tq.queue_id // 2 for tq in fetchers if tq.queue_id >= 2}
    a0, a3 = TopicQueue("t", "broker-a", 0), TopicQueue("t", "broker-a", 3)
    b1 = TopicQueue("t", "broker-b", 1)
    fetchers[a0]._push([_Rec(i) for i in range(20)], 20)  # type: ignore[misc]
    fetchers[b1]._push([_Rec(i) for i in range(20)], 20)  # type: ignore[misc]
    fetchers[a3]._push([_Rec(0), _Rec(1)], 2)             # type: ignore[list-item]
    out = consumer._take(4)
    # broker-a's level-1 queue before its level 0; broker-b has only level 0
    assert out == {a3: [_Rec(0), _Rec(1)], b1: [_Rec(0), _Rec(1)]}
    out = consumer._take(10)   # level 1 drained: level 0 is served
    assert set(out) == {a0, b1} and sum(map(len, out.values())) == 10


@pytest.mark.integration
async def test_a_high_priority_message_overtakes_10000_waiting(mesh: Mesh) -> None:
    topic, group = unique("prio"), unique("g")
    async with Admin(namesrv=mesh.namesrv) as admin:
        await admin.create_topic(topic, queues=4, priority_levels=2, brokers=["broker-a"])
    batch = 32
    async with Producer(namesrv=mesh.namesrv) as producer:
        for start in range(0, 10_000, 500):
            await producer.send_batch(topic, [Message(f"low-{i}".encode())
                                              for i in range(start, start + 500)])
        async with Consumer(topic, group=group, namesrv=mesh.namesrv,
                            auto_offset_reset="earliest", max_poll_records=batch,
                            pull_batch_size=batch, **FAST) as consumer:
            first = await consumer.getmany(timeout_ms=15_000)
            assert first and all(r.body.startswith(b"low-") for rs in first.values() for r in rs)
            high = await producer.send_and_wait(topic, b"high", priority=3)
            assert high.queue_id >= 2
            stored_at = time.monotonic()
            after = 0
            while True:
                got = await consumer.getmany(timeout_ms=5_000)
                assert got, "the high-priority message never arrived"
                records = [r for rs in got.values() for r in rs]
                if any(r.body == b"high" for r in records):
                    after += next(i for i, r in enumerate(records) if r.body == b"high")
                    break
                after += len(records)
                # the application's work on a batch: the high queue's pull returns meanwhile
                await asyncio.sleep(0.2)
                assert time.monotonic() - stored_at < 60
    # at most the batch already handed out when it was stored goes first: it is in the
    # next one, ahead of the ~9,900 low-priority messages still waiting
    assert after <= batch
