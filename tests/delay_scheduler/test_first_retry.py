"""A consumer group's first retry arrives within its back-off (real processes).

A new group has no retry topic until a broker stores its first retry: the
consumer used to find the topic's route only at its next periodic rebalance
(5 s by default), so the first retry came ~5 s after the nack whatever the
back-off (issue 26). The bound here is the issue's: back-off + 500 ms, from
the first retry on, with the consumer's default rebalance interval.
"""
from __future__ import annotations

import asyncio
import time

import pytest
from ferry.client import Admin, Consumer, ConsumerRecord, Producer

from tests.client.conftest import Mesh, unique
from tests.delay_scheduler.conftest import start_scheduler, wait_for

pytestmark = pytest.mark.integration

BACKOFF_MS = 300
BOUND_MS = BACKOFF_MS + 500   # the bound on a redelivery's lateness after a nack
FAILURES = 3


async def test_first_retry_of_a_new_group_arrives_within_the_backoff(delay_mesh: Mesh) -> None:
    sched = start_scheduler(delay_mesh, unique("sched"))
    topic, group = unique("first-retry"), unique("g")
    try:
        wait_for(lambda: sched.stats()["role"] == "leader", what="leadership")
        async with Admin(namesrv=delay_mesh.namesrv) as admin:
            await admin.create_group(group, retry_backoff_ms=[BACKOFF_MS],
                                     consume_from="earliest")
        async with Producer(namesrv=delay_mesh.namesrv) as producer:
            await producer.send_and_wait(topic, b"job")
        seen: list[tuple[float, int]] = []   # (monotonic s, reconsume_times)
        done = asyncio.Event()

        async def handler(rec: ConsumerRecord) -> None:
            seen.append((time.monotonic(), rec.reconsume_times))
            if len(seen) <= FAILURES:
                raise RuntimeError("not yet")
            done.set()

        # The consumer's default heartbeat and rebalance intervals (5 s).
        async with Consumer(topic, group=group, namesrv=delay_mesh.namesrv) as consumer:
            runner = asyncio.ensure_future(consumer.run(handler))
            waiter = asyncio.ensure_future(done.wait())
            await asyncio.wait({runner, waiter}, timeout=60,
                               return_when=asyncio.FIRST_COMPLETED)
            for task in (runner, waiter):
                task.cancel()
            await asyncio.gather(runner, waiter, return_exceptions=True)
        assert done.is_set(), seen
    finally:
        sched.proc.stop()
    assert [n for _, n in seen] == list(range(FAILURES + 1))
    gaps_ms = [round((b - a) * 1000) for (a, _), (b, _) in zip(seen, seen[1:], strict=False)]
    assert all(BACKOFF_MS <= gap <= BOUND_MS for gap in gaps_ms), gaps_ms
