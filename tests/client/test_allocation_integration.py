"""A consistent_hash group on real brokers: each member joining moves at most
ceil(queues / members) + 1 queues, measured on what the consumers really own; nothing is lost."""
from __future__ import annotations

import asyncio
import contextlib
import math

import pytest
from ferry import Admin, Consumer, Producer, TopicQueue

from tests.client.conftest import Mesh, unique
from tests.client.util import FAST, collect

pytestmark = pytest.mark.integration

QUEUES_PER_BROKER = 5
MEMBERS = 4


def _owners(consumers: list[Consumer], topic: str) -> dict[TopicQueue, list[str]]:
    """Queue of `topic` -> the client ids that hold it now."""
    owners: dict[TopicQueue, list[str]] = {}
    for c in consumers:
        for tq in c.assignment():
            if tq.topic == topic:
                owners.setdefault(tq, []).append(c.client_id)
    return owners


async def _settle(consumers: list[Consumer], topic: str, queues: list[TopicQueue],
                  sink: list[bytes], timeout_s: float = 30.0) -> dict[TopicQueue, str]:
    """Wait until the members own a balanced disjoint cover of the queues, every member
    holding a share; records taken meanwhile go to `sink`. Returns queue -> owner."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        owners = _owners(consumers, topic)
        sizes = [sum(c.client_id in ids for ids in owners.values()) for c in consumers]
        if (sorted(owners) == queues and all(len(ids) == 1 for ids in owners.values())
                and max(sizes) - min(sizes) <= 1):
            return {q: ids[0] for q, ids in owners.items()}
        assert loop.time() < deadline, owners
        for c in consumers:   # keep them consuming while they rebalance
            batch = await c.getmany(timeout_ms=20)
            sink.extend(r.body for recs in batch.values() for r in recs)


async def test_each_joining_member_moves_at_most_ceil_queues_per_member_plus_one(
        mesh: Mesh) -> None:
    topic, group = unique("chash"), unique("g")
    async with Admin(namesrv=mesh.namesrv) as admin:
        await admin.create_topic(topic, queues=QUEUES_PER_BROKER)
        queues = sorted(i.tq for i in await admin.queue_infos(topic))
    n = len(queues)
    assert n >= 2 * QUEUES_PER_BROKER
    bodies: list[bytes] = []
    async with contextlib.AsyncExitStack() as stack, Producer(namesrv=mesh.namesrv) as producer:
        consumers: list[Consumer] = []
        owner: dict[TopicQueue, str] = {}
        for size in range(1, MEMBERS + 1):
            # members start one after another, with the Consumer's own random client ids
            consumers.append(await stack.enter_async_context(Consumer(
                topic, group=group, namesrv=mesh.namesrv, auto_offset_reset="earliest",
                allocation="consistent_hash", **FAST)))
            after = await _settle(consumers, topic, queues, bodies)
            if size > 1:
                moved = sum(1 for q in queues if after[q] != owner[q])
                assert 1 <= moved <= math.ceil(n / size) + 1, (size, moved)
                assert {q for q in queues if after[q] != owner[q]} == {
                    q for q in queues if after[q] == consumers[-1].client_id}
            owner = after
            futs = [await producer.send(topic, f"m{size}-{i}".encode()) for i in range(100)]
            await asyncio.gather(*futs)
        want = {f"m{s}-{i}".encode() for s in range(1, MEMBERS + 1) for i in range(100)}
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 30
        while not want <= set(bodies) and loop.time() < deadline:   # redeliveries count once
            got = await collect(consumers, len(want - set(bodies)), timeout_s=10)
            bodies += [r.body for recs in got.values() for r in recs]
        assert set(bodies) == want
