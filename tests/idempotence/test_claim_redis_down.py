"""RedisClaim when Redis is down: the configured policy decides, never a silent skip."""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from ferry.client.core.message import ConsumerRecord
from ferry.idempotence import ClaimState, ClaimUnavailableError, RedisClaim, RedisUnavailablePolicy

from tests.idempotence.conftest import record, unique_prefix
from tests.support.procs import Redis, start_redis

pytestmark = pytest.mark.integration


@pytest.fixture
def doomed_redis(tmp_path: Path) -> Iterator[Redis]:
    """A throwaway Redis a test may stop."""
    server = start_redis(tmp_path)
    yield server
    server.proc.stop()


async def test_redis_down_fails_the_message_by_default(doomed_redis: Redis) -> None:
    calls: list[str] = []

    async def handle(rec: ConsumerRecord) -> None:
        calls.append(rec.msg_id)

    async with RedisClaim(doomed_redis.url, key_prefix=unique_prefix()) as claim:
        assert claim.on_unavailable is RedisUnavailablePolicy.FAIL
        assert await claim.run(record(key="a"), handle, scene="pay") is ClaimState.CLAIMED
        doomed_redis.proc.stop()
        with pytest.raises(ClaimUnavailableError) as err:
            await claim.run(record(key="b"), handle, scene="pay")
        assert err.value.retriable   # Consumer.run nacks it: the message comes back later
        assert len(calls) == 1 and claim.stats.unavailable_failed == 1


async def test_redis_down_with_policy_process_runs_unchecked_and_counts(
        doomed_redis: Redis, caplog: pytest.LogCaptureFixture) -> None:
    calls: list[str] = []

    async def handle(rec: ConsumerRecord) -> None:
        calls.append(rec.msg_id)

    async with RedisClaim(doomed_redis.url, key_prefix=unique_prefix(),
                          on_unavailable=RedisUnavailablePolicy.PROCESS) as claim:
        doomed_redis.proc.stop()
        rec = record(key="c")
        assert await claim.run(rec, handle, scene="pay") is ClaimState.UNCHECKED
        assert await claim.run(rec, handle, scene="pay") is ClaimState.UNCHECKED
        assert calls == [rec.msg_id, rec.msg_id]   # no check: it may run twice, as documented
        assert claim.stats.unavailable_unchecked == 2
        assert "WITHOUT the duplicate check" in caplog.text


async def test_confirm_lost_to_a_dying_redis_is_counted_not_raised(doomed_redis: Redis) -> None:
    async def handle_then_redis_dies(rec: ConsumerRecord) -> None:
        doomed_redis.proc.stop()

    async with RedisClaim(doomed_redis.url, key_prefix=unique_prefix()) as claim:
        outcome = await claim.run(record(key="d"), handle_then_redis_dies, scene="pay")
        assert outcome is ClaimState.CLAIMED   # the work is done: acknowledge it
        assert claim.stats.confirm_failed == 1 and claim.stats.confirmed == 0
