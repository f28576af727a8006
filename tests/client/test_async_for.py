"""`async for record in consumer` in runs of one queue (ferry.client.consuming.handout):
every record once, each queue in order, and positions exact at a crash mid-iteration
(real namesrv and brokers; topics of 4 queues per broker, more records per queue than a run)."""
from __future__ import annotations

import asyncio
from collections import defaultdict

import pytest
from ferry import Admin, Consumer, ConsumerRecord, Producer
from ferry.client.consuming.handout import RUN

from tests.client.conftest import Mesh, unique
from tests.client.util import FAST

pytestmark = pytest.mark.integration

#: Queues per broker, and records per queue: more than one run of each queue.
QUEUES = 4


async def fill(mesh: Mesh, topic: str, per_queue: int) -> int:
    """`per_queue` records in each queue of the topic's two brokers (sent by key round-robin)."""
    async with Admin(namesrv=mesh.namesrv) as admin:
        await admin.create_topic(topic, queues=QUEUES)
    total = per_queue * QUEUES * len(mesh.brokers)
    async with Producer(namesrv=mesh.namesrv) as producer:
        await asyncio.gather(*[await producer.send(topic, b"%d" % i) for i in range(total)])
    return total


def in_queue_order(records: list[ConsumerRecord]) -> bool:
    last: dict[object, int] = {}
    for r in records:
        if last.get(r.topic_queue, -1) >= r.queue_offset:
            return False
        last[r.topic_queue] = r.queue_offset
    return True


async def test_async_for_hands_out_every_queue_once_in_order(mesh: Mesh) -> None:
    topic, group = unique("runs"), unique("g")
    total = await fill(mesh, topic, RUN + 11)
    got: list[ConsumerRecord] = []
    async with Consumer(topic, group=group, namesrv=mesh.namesrv, auto_offset_reset="earliest",
                        **FAST) as consumer:
        async for record in consumer:
            got.append(record)
            if len(got) == total:
                break
    assert sorted(int(r.body) for r in got) == list(range(total))   # each once
    assert in_queue_order(got)
    per_queue: dict[object, int] = defaultdict(int)
    for r in got[:RUN * QUEUES]:   # runs take turns: every queue started early, none starved
        per_queue[r.topic_queue] += 1
    assert len(per_queue) >= QUEUES


async def test_a_crash_mid_iteration_redelivers_only_the_record_in_hand(mesh: Mesh) -> None:
    """The records handed out before the one in hand count as processed, those after it do
    not exist yet for the group: a new member starts exactly at the one in hand."""
    topic, group = unique("crash"), unique("g")
    total = await fill(mesh, topic, RUN + 11)
    first: list[ConsumerRecord] = []
    in_hand = RUN + RUN // 2   # mid-way through a second run
    with pytest.raises(RuntimeError):
        async with Consumer(topic, group=group, namesrv=mesh.namesrv,
                            auto_offset_reset="earliest", **FAST) as consumer:
            async for record in consumer:
                first.append(record)
                if len(first) == in_hand:
                    raise RuntimeError("the handler crashed")   # stop(processed=False)
    second: list[ConsumerRecord] = []
    async with Consumer(topic, group=group, namesrv=mesh.namesrv, auto_offset_reset="earliest",
                        **FAST) as consumer:
        async def rest() -> None:
            async for record in consumer:
                second.append(record)
                if len(second) == total - in_hand + 1:
                    break
        try:
            await asyncio.wait_for(rest(), 30)
        except TimeoutError:
            pytest.fail(f"{len(second)} of the {total - in_hand + 1} records left came")
        await asyncio.sleep(0.5)   # nothing more comes
        assert not await consumer.getmany(timeout_ms=500)
    again = {int(r.body) for r in first} & {int(r.body) for r in second}
    assert again == {int(first[-1].body)}   # only the record in hand, once more
    assert {int(r.body) for r in first} | {int(r.body) for r in second} == set(range(total))
