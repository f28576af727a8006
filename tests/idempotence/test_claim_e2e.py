"""RedisClaim around real Ferry consumers: every message delivered twice, handled once.

A real namesrv and broker (processes) on the session etcd, the session Redis.
The first consumer handles all 1,000 messages with `async for`-style reads and
`claim.guard`, then "crashes" before committing: its positions go back to the
start and nothing past them is committed, so a restarted member of the same
group is handed every message again. The restarted consumer runs the same
handler with `consumer.run(claim.wrap(...))`: each redelivery finds "done".
"""
from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterator

import pytest
from ferry import Admin, Consumer, Producer
from ferry.client.core.message import ConsumerRecord
from ferry.idempotence import ClaimBusyError, RedisClaim
from ferry.idempotence.claim import Handler

from tests.client.conftest import Mesh, start_mesh, unique
from tests.client.util import FAST
from tests.idempotence.conftest import unique_prefix
from tests.support.procs import Etcd, Redis

MESSAGES = 1_000
DEADLINE_S = 60.0

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def mesh(etcd: Etcd, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mesh]:
    m = start_mesh(etcd, tmp_path_factory.mktemp("mesh"), broker_names=("broker-a",))
    yield m
    m.stop()


async def _send(mesh: Mesh, topic: str) -> None:
    # Half the messages carry a business key, half are keyed by their message id.
    async with Producer(namesrv=mesh.namesrv) as producer:
        futs = [await producer.send(topic, f"m{i}".encode(),
                                    key=f"order-{i}" if i % 2 else None)
                for i in range(MESSAGES)]
        await asyncio.gather(*futs)


async def _first_pass_then_crash(mesh: Mesh, topic: str, group: str, claim: RedisClaim,
                                 handle: Handler) -> set[str]:
    """Handle every message once, then leave without committing any of them."""
    seen: set[str] = set()
    consumer = Consumer(topic, group=group, namesrv=mesh.namesrv, auto_offset_reset="earliest",
                        enable_auto_commit=False, **FAST)
    await consumer.start()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + DEADLINE_S
    while len(seen) < MESSAGES and loop.time() < deadline:
        for records in (await consumer.getmany(timeout_ms=1_000)).values():
            for rec in records:
                async with claim.guard(rec, scene="billing") as c:
                    if c.should_run:
                        await handle(rec)
                seen.add(rec.msg_id)
    for tq in consumer.assignment():   # as after a crash before the first commit
        await consumer.seek(tq, 0)
    await consumer.stop(processed=False)
    return seen


async def test_each_message_delivered_twice_runs_the_handler_once(
        mesh: Mesh, redis_server: Redis) -> None:
    topic, group = unique("idem"), unique("g")
    await _send(mesh, topic)
    runs: Counter[str] = Counter()

    async def handle(rec: ConsumerRecord) -> None:
        runs[rec.msg_id] += 1

    async with RedisClaim(redis_server.url, key_prefix=unique_prefix()) as claim:
        first = await _first_pass_then_crash(mesh, topic, group, claim, handle)
        assert len(first) == MESSAGES

        async with Consumer(topic, group=group, namesrv=mesh.namesrv,
                            auto_offset_reset="earliest", **FAST) as consumer:
            running = asyncio.create_task(consumer.run(claim.wrap(handle, scene="billing"),
                                                       concurrency=8))
            loop = asyncio.get_running_loop()
            deadline = loop.time() + DEADLINE_S
            while claim.stats.skipped_done < MESSAGES and loop.time() < deadline:
                await asyncio.sleep(0.1)
            await consumer.stop()
            await running

    assert claim.stats.skipped_done == MESSAGES   # every message came back once more...
    assert set(runs) == first and set(runs.values()) == {1}   # ...and ran once in all
    assert claim.stats.claimed == claim.stats.confirmed == MESSAGES


async def test_a_message_another_holder_is_processing_is_retried_not_skipped(
        mesh: Mesh, redis_server: Redis) -> None:
    topic, group = unique("idem-busy"), unique("g")
    async with Admin(namesrv=mesh.namesrv) as admin:
        # back-off 0: the retry copy is stored at once (no delay scheduler needed)
        await admin.create_group(group, retry_backoff_ms=[0], consume_from="earliest")
    async with Producer(namesrv=mesh.namesrv) as producer:
        await producer.send_and_wait(topic, b"pay", key="order-busy")
    prefix = unique_prefix()
    ran: list[int] = []
    done = asyncio.Event()

    async def handle(rec: ConsumerRecord) -> None:
        ran.append(rec.reconsume_times)
        done.set()

    async with RedisClaim(redis_server.url, key_prefix=prefix) as other, \
            RedisClaim(redis_server.url, key_prefix=prefix) as claim:
        held = await other.acquire("billing", "order-busy")   # another consumer is on it
        claimed = claim.wrap(handle, scene="billing")

        async def handler(rec: ConsumerRecord) -> None:
            try:
                await claimed(rec)
            except ClaimBusyError:
                await other.release(held)   # the other holder fails: the retry may take it
                raise

        async with Consumer(topic, group=group, namesrv=mesh.namesrv, **FAST) as consumer:
            running = asyncio.create_task(consumer.run(handler))
            await asyncio.wait_for(done.wait(), DEADLINE_S)
            await consumer.stop()
            await running
        assert ran == [1]   # not run while busy, not skipped: run on the first retry
        assert claim.stats.busy == 1 and claim.stats.confirmed == 1
        assert await claim.state_of("billing", "order-busy") == "done"
