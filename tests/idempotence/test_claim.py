"""RedisClaim on a real Redis: claim, confirm, release, duplicates, leases, stale owners, races."""
from __future__ import annotations

import asyncio

import pytest
from ferry.client.core.message import ConsumerRecord
from ferry.errors import FerryError
from ferry.idempotence import (
    ClaimBusyError,
    ClaimState,
    RedisClaim,
    biz_key_of,
    claim_key,
)
from ferry.idempotence.keys import MAX_BIZ_KEY_CHARS

from tests.idempotence.conftest import record, unique_prefix
from tests.support.procs import Redis

pytestmark = pytest.mark.integration


def test_biz_key_is_the_message_key_else_the_message_id() -> None:
    assert biz_key_of(record(key="order-17", msg_id="AB" * 16)) == "order-17"
    assert biz_key_of(record(msg_id="AB" * 16)) == "AB" * 16


def test_key_names_validate_the_scene_and_bound_the_biz_key() -> None:
    assert claim_key("pay", "order-17") == "ferry:idem:pay:order-17"
    for bad in ("", "a:b", "a b", "-pay", "x" * 65):
        with pytest.raises(FerryError, match="scene"):
            claim_key(bad, "k")
    with pytest.raises(FerryError, match="business key"):
        claim_key("pay", "")
    long_key = claim_key("pay", "k" * (MAX_BIZ_KEY_CHARS + 1))
    assert long_key.startswith("ferry:idem:pay:sha256:") and len(long_key) < 100
    # a raw key that looks hashed cannot collide with a real hash
    assert claim_key("pay", "sha256:abc") != "ferry:idem:pay:sha256:abc"


async def test_claim_confirm_then_duplicate_is_done(claim: RedisClaim) -> None:
    first = await claim.acquire("pay", "order-1")
    assert first.state is ClaimState.CLAIMED and first.should_run
    assert await claim.state_of("pay", "order-1") == "processing"
    assert await claim.confirm(first)
    assert await claim.state_of("pay", "order-1") == "done"
    dup = await claim.acquire("pay", "order-1")
    assert dup.state is ClaimState.DONE and not dup.should_run
    # another scene is another use of the same message
    assert (await claim.acquire("ship", "order-1")).state is ClaimState.CLAIMED


async def test_release_lets_the_retry_claim_again(claim: RedisClaim) -> None:
    first = await claim.acquire("pay", "order-2")
    assert await claim.release(first)
    assert await claim.state_of("pay", "order-2") is None
    again = await claim.acquire("pay", "order-2")
    assert again.state is ClaimState.CLAIMED


async def test_done_expires_after_its_ttl(redis_server: Redis) -> None:
    async with RedisClaim(redis_server.url, done_ttl_ms=1_000, key_prefix=unique_prefix()) as c:
        first = await c.acquire("pay", "order-ttl")
        assert await c.confirm(first)
        ttl_ms = await c._redis.pttl(first.key)
        assert 0 < ttl_ms <= 1_000


async def test_duplicate_during_processing_is_retried_not_skipped(claim: RedisClaim) -> None:
    started, finish = asyncio.Event(), asyncio.Event()
    calls: list[str] = []

    async def slow(rec: ConsumerRecord) -> None:
        calls.append(rec.msg_id)
        started.set()
        await finish.wait()

    rec = record(key="order-3")
    first = asyncio.create_task(claim.run(rec, slow, scene="pay"))
    await started.wait()
    with pytest.raises(ClaimBusyError) as busy:
        await claim.run(rec, slow, scene="pay")
    assert busy.value.retriable
    finish.set()
    assert await first is ClaimState.CLAIMED
    assert await claim.run(rec, slow, scene="pay") is ClaimState.DONE
    assert len(calls) == 1
    assert (claim.stats.claimed, claim.stats.busy, claim.stats.skipped_done) == (1, 1, 1)


async def test_failing_handler_releases_and_the_retry_runs(claim: RedisClaim) -> None:
    calls = 0

    async def flaky(rec: ConsumerRecord) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("business write failed")

    rec = record(key="order-4")
    with pytest.raises(RuntimeError):
        await claim.run(rec, flaky, scene="pay")
    assert await claim.state_of("pay", "order-4") is None
    assert await claim.run(rec, flaky, scene="pay") is ClaimState.CLAIMED
    assert await claim.run(rec, flaky, scene="pay") is ClaimState.DONE
    assert calls == 2


async def test_guard_for_async_for_loops(claim: RedisClaim) -> None:
    ran: list[str] = []
    for rec in [record(key="order-5"), record(key="order-5")]:
        async with claim.guard(rec, scene="pay") as c:
            if not c.should_run:
                continue
            ran.append(rec.msg_id)
    assert len(ran) == 1
    assert await claim.state_of("pay", "order-5") == "done"


async def test_wrap_is_a_handler(claim: RedisClaim) -> None:
    seen: list[str] = []

    async def handle(rec: ConsumerRecord) -> None:
        seen.append(rec.msg_id)

    handler = claim.wrap(handle, scene="pay")
    rec = record()   # no key: the message id is the business key
    assert await handler(rec) is ClaimState.CLAIMED
    assert await handler(rec) is ClaimState.DONE
    assert seen == [rec.msg_id]


async def test_lease_expiry_lets_another_take_over_and_the_stale_owner_loses(
        redis_server: Redis) -> None:
    prefix = unique_prefix()
    async with RedisClaim(redis_server.url, lease_ms=200, key_prefix=prefix) as a, \
            RedisClaim(redis_server.url, lease_ms=5_000, key_prefix=prefix) as b:
        stale = await a.acquire("pay", "order-6")
        assert (await b.acquire("pay", "order-6")).state is ClaimState.PROCESSING
        while await a.state_of("pay", "order-6") is not None:   # the 200 ms lease runs out
            await asyncio.sleep(0.05)
        fresh = await b.acquire("pay", "order-6")
        assert fresh.state is ClaimState.CLAIMED
        assert not await a.extend(stale)
        assert not await a.confirm(stale)
        assert not await a.release(stale)
        assert a.stats.lost == 3
        assert await b.state_of("pay", "order-6") == "processing"   # untouched
        assert await b.confirm(fresh)
        assert not await a.release(stale)
        assert await b.state_of("pay", "order-6") == "done"


async def test_extend_keeps_our_lease(redis_server: Redis) -> None:
    async with RedisClaim(redis_server.url, lease_ms=200, key_prefix=unique_prefix()) as c:
        mine = await c.acquire("pay", "order-7")
        assert await c.extend(mine, 60_000)
        assert await c._redis.pttl(mine.key) > 1_000


async def test_fifty_tasks_racing_on_one_key_run_it_once(redis_server: Redis) -> None:
    prefix = unique_prefix()
    claims = [RedisClaim(redis_server.url, key_prefix=prefix) for _ in range(5)]
    runs = 0

    async def handle(rec: ConsumerRecord) -> None:
        nonlocal runs
        runs += 1
        await asyncio.sleep(0.2)   # still processing while the others try

    rec = record(key="order-race")
    try:
        outcomes = await asyncio.gather(
            *(claims[i % 5].run(rec, handle, scene="pay") for i in range(50)),
            return_exceptions=True)
    finally:
        for c in claims:
            await c.aclose()
    assert runs == 1
    assert outcomes.count(ClaimState.CLAIMED) == 1
    # the others found it processing (retry later) or, if late, done (skip)
    busy = sum(isinstance(o, ClaimBusyError) for o in outcomes)
    assert busy + outcomes.count(ClaimState.DONE) == 49 and busy > 0


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="lease_ms"):
        RedisClaim("redis://127.0.0.1:1/0", lease_ms=10)
    with pytest.raises(ValueError, match="done_ttl_ms"):
        RedisClaim("redis://127.0.0.1:1/0", done_ttl_ms=0)
