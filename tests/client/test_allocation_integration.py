"""A consistent_hash group on real brokers: a member joining moves few queues, nothing is lost."""
from __future__ import annotations

import asyncio
import contextlib
import math

import pytest
from ferry import Admin, Consumer, Producer, TopicQueue
from ferry.client.allocation import allocate_all

from tests.client.conftest import Mesh, unique
from tests.client.util import FAST, collect

pytestmark = pytest.mark.integration


async def _settle(consumers: list[Consumer], want: dict[str, list[TopicQueue]],
                  sink: list[bytes], timeout_s: float = 30.0) -> None:
    """Until each member holds what the strategy gives it; records taken meanwhile go to sink."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while {c.client_id: sorted(c.assignment()) for c in consumers} != want:
        assert loop.time() < deadline, [sorted(c.assignment()) for c in consumers]
        for c in consumers:   # keep them consuming while they rebalance
            batch = await c.getmany(timeout_ms=20)
            sink.extend(r.body for recs in batch.values() for r in recs)


async def test_a_joining_member_moves_at_most_ceil_queues_per_member_plus_one(mesh: Mesh) -> None:
    topic, group = unique("chash"), unique("g")
    async with Admin(namesrv=mesh.namesrv) as admin:
        await admin.create_topic(topic, queues=4)
        queues = sorted(i.tq for i in await admin.queue_infos(topic))
    assert len(queues) == 8
    ids = [f"{group}-member-{c}" for c in "abcd"]
    async with contextlib.AsyncExitStack() as stack:
        consumers = [await stack.enter_async_context(Consumer(
            topic, group=group, namesrv=mesh.namesrv, client_id=cid, auto_offset_reset="earliest",
            allocation="consistent_hash", **FAST)) for cid in ids[:3]]
        before = allocate_all(queues, ids[:3], "consistent_hash")
        bodies: list[bytes] = []
        await _settle(consumers, before, bodies)
        async with Producer(namesrv=mesh.namesrv) as producer:
            futs = [await producer.send(topic, f"m{i}".encode()) for i in range(400)]
            await asyncio.gather(*futs)
        consumers.append(await stack.enter_async_context(Consumer(
            topic, group=group, namesrv=mesh.namesrv, client_id=ids[3],
            auto_offset_reset="earliest", allocation="consistent_hash", **FAST)))
        after = allocate_all(queues, ids, "consistent_hash")
        await _settle(consumers, after, bodies)
        owner = {q: m for m, qs in before.items() for q in qs}
        moved = sum(1 for m, qs in after.items() for q in qs if owner.get(q) != m)
        assert 1 <= moved <= math.ceil(len(queues) / len(ids)) + 1
        got = await collect(consumers, 400 - len(bodies), timeout_s=30)
        bodies += [r.body for recs in got.values() for r in recs]
        assert set(bodies) == {f"m{i}".encode() for i in range(400)}
