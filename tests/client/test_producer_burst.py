"""A burst of plain sends (thousands of `await producer.send()` in a row, then `gather`, as
the aiokafka docs show) on real brokers: its batches go out while the burst goes on.

The loop does not turn between the sends of a burst unless the producer yields
(`accumulator`: once a batch that could go out has grown to BURST_YIELD_FRACTION
of `max_batch_bytes`). Right after the last send, before this test lets its own
loop turn, a second thread (its own loop, its own client) finds messages stored
on the brokers already: the first batches went out during the burst. Then every
future resolves to where its message was stored, each stored once.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import time

import pytest
from ferry.client import Admin, Producer

from tests.client.conftest import Mesh, unique

pytestmark = pytest.mark.integration

BURST = 4000
BODY = b"b" * 512
MAX_BATCH_BYTES = 64 * 1024   # so that the burst yields every few KiB per queue


def _stored(namesrv: str, topic: str) -> int:
    """Messages stored in `topic`, asked from another thread with an event loop of its own."""
    async def ask() -> int:
        async with Admin(namesrv=namesrv) as admin:
            return sum(q.max_offset - q.min_offset for q in await admin.queue_infos(topic))
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, ask()).result(timeout=30)


async def test_a_burst_sends_its_first_batches_before_it_ends(mesh: Mesh) -> None:
    topic = unique("burst")
    async with Admin(namesrv=mesh.namesrv) as admin:
        await admin.create_topic(topic, queues=4)
    async with Producer(namesrv=mesh.namesrv, max_batch_bytes=MAX_BATCH_BYTES) as producer:
        await producer.send_and_wait(topic, b"route")   # the route and connections first
        futures = [await producer.send(topic, BODY) for _ in range(BURST)]
        # No turn of this loop since the last send: only what went out DURING the burst can
        # be stored now (the wait blocks the loop, as the burst did; the brokers run on).
        deadline = time.monotonic() + 20
        stored = _stored(mesh.namesrv, topic)
        while stored <= 1 and time.monotonic() < deadline:
            time.sleep(0.2)
            stored = _stored(mesh.namesrv, topic)
        assert stored > 1, "nothing of the burst reached a broker before it ended"
        assert not all(f.done() for f in futures)   # the burst was not sent one by one
        results = await asyncio.gather(*futures)
    places = {(r.broker, r.queue_id, r.queue_offset) for r in results}
    assert len(places) == BURST   # every message stored, each at its own offset
    assert _stored(mesh.namesrv, topic) == BURST + 1
