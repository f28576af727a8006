"""The wiring of `consumer.run(handler, idempotence=...)`, called directly with stand-in records.

Each kind of check (RedisClaim, Ledger, ledger.transactional, a wrap() object)
on real Redis, SQLite and PostgreSQL; the consumer itself is exercised by the
integration tests (test_run_*.py).
"""
from __future__ import annotations

import asyncio
import sqlite3
import uuid
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import psycopg
import pytest
from ferry.client.core.batch_hook import BatchHook, batch_hook
from ferry.client.core.message import ConsumerRecord
from ferry.errors import FerryError
from ferry.idempotence import (
    ClaimBusyError,
    ClaimState,
    DuplicateMessage,
    IdempotenceStats,
    Ledger,
    Outcome,
    RedisClaim,
)
from ferry.idempotence.wiring import Handler, wire

from tests.idempotence.backends import pg_conninfo
from tests.idempotence.conftest import unique_prefix
from tests.support.procs import Postgres, Redis

pytestmark = pytest.mark.integration

GROUP = "billing-group"


@dataclass(frozen=True)
class Msg:
    """A consumed message as the checks read it (a ferry.ConsumerRecord has these)."""

    msg_id: str
    key: str | None = None
    topic: str = "orders"
    queue_id: int = 0
    queue_offset: int = 0
    reconsume_times: int = 0


def msg(key: str | None = None) -> ConsumerRecord:
    return cast(ConsumerRecord, Msg(uuid.uuid4().hex.upper(), key))


async def test_a_redis_claim_defaults_to_the_group_as_scene_and_counts(
        redis_server: Redis) -> None:
    runs: list[str] = []

    async def handle(rec: ConsumerRecord) -> None:
        runs.append(rec.msg_id)

    stats = IdempotenceStats()
    async with RedisClaim(redis_server.url, key_prefix=unique_prefix()) as claim:
        wired = wire(handle, claim, group=GROUP, stats=stats)
        rec = msg("order-1")
        assert await wired(rec) is Outcome.RAN
        assert await wired(rec) is Outcome.DUPLICATE
        assert await claim.state_of(GROUP, "order-1") == "done"
    assert runs == [rec.msg_id]
    assert (stats.ran, stats.duplicates) == (1, 1)


async def test_a_claims_own_scene_wins_and_busy_is_counted_and_raised(
        redis_server: Redis) -> None:
    async def handle(rec: ConsumerRecord) -> None:
        pass

    stats = IdempotenceStats()
    prefix = unique_prefix()
    async with RedisClaim(redis_server.url, key_prefix=prefix, scene="ship") as claim, \
            RedisClaim(redis_server.url, key_prefix=prefix) as other:
        await other.acquire("ship", "order-2")   # another consumer is processing it
        wired = wire(handle, claim, group=GROUP, stats=stats)
        with pytest.raises(ClaimBusyError):
            await wired(msg("order-2"))
        assert await wired(msg("order-3")) is Outcome.RAN
        assert await claim.state_of("ship", "order-3") == "done"
        assert await claim.state_of(GROUP, "order-3") is None
    assert (stats.busy, stats.ran, stats.failed) == (1, 1, 0)


async def test_a_ledger_handler_raising_duplicate_is_acknowledged(tmp_path: Path) -> None:
    db = sqlite3.connect(tmp_path / "app.db")
    db.execute("CREATE TABLE orders (order_id TEXT NOT NULL)")
    db.commit()
    ledger = Ledger(group=GROUP)

    async def handle(rec: ConsumerRecord) -> None:
        with db:
            db.execute("INSERT INTO orders VALUES (?)", (rec.key,))
            ledger.record(db, scene="billing", record=rec)

    stats = IdempotenceStats()
    wired = wire(handle, ledger, group=GROUP, stats=stats)
    rec = msg("order-4")
    assert await wired(rec) is Outcome.RAN
    assert await wired(rec) is Outcome.DUPLICATE   # not raised: the record is acknowledged
    assert db.execute("SELECT COUNT(*) FROM orders").fetchone()[0] == 1
    assert (stats.ran, stats.duplicates) == (1, 1)
    db.close()


async def test_transactional_on_sqlite_records_first_and_rolls_back_a_failure(
        tmp_path: Path) -> None:
    path = tmp_path / "app.db"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE orders (order_id TEXT NOT NULL)")
    fail = {"order-5": True}

    async def handle(rec: ConsumerRecord, conn: sqlite3.Connection) -> None:
        conn.execute("INSERT INTO orders VALUES (?)", (rec.key,))
        if fail.pop(rec.key or "", False):
            raise RuntimeError("failed after the business write")

    check = Ledger().transactional(connect=lambda: sqlite3.connect(path, timeout=30))
    stats = IdempotenceStats()
    wired = wire(handle, check, group=GROUP, stats=stats)
    rec = msg("order-5")
    with pytest.raises(RuntimeError):
        await wired(rec)
    with sqlite3.connect(path) as db:   # neither the business row nor the ledger row
        assert db.execute("SELECT COUNT(*) FROM orders").fetchone()[0] == 0
        assert Ledger().by_biz_key(db, scene=GROUP, biz_key="order-5") is None
    assert await wired(rec) is Outcome.RAN          # the retry
    assert await wired(rec) is Outcome.DUPLICATE    # a redelivery
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT COUNT(*) FROM orders").fetchone()[0] == 1
        entry = Ledger().by_biz_key(db, scene=GROUP, biz_key="order-5")
        assert entry is not None and entry.group == GROUP and entry.msg_id == rec.msg_id
    assert (stats.failed, stats.ran, stats.duplicates) == (1, 1, 1)
    await check.aclose()


async def test_transactional_on_postgres_runs_concurrently_once_per_key(
        postgres: Postgres, pg_database: str) -> None:
    dsn = pg_conninfo(postgres, pg_database)
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute("CREATE TABLE orders (order_id TEXT NOT NULL)")

    async def handle(rec: ConsumerRecord, conn: psycopg.AsyncConnection[Any]) -> None:
        await conn.execute("INSERT INTO orders VALUES (%s)", (rec.key,))
        await asyncio.sleep(0.01)   # a racing duplicate waits on the ledger row's lock

    async with Ledger().transactional(connect=lambda: psycopg.AsyncConnection.connect(dsn),
                                      scene="billing", max_idle=4) as check:
        stats = IdempotenceStats()
        wired = wire(handle, check, group=GROUP, stats=stats)
        records = [msg(f"order-{i}") for i in range(20)]
        outcomes = await asyncio.gather(*(wired(r) for r in records + records))
    assert outcomes.count(Outcome.RAN) == 20 and outcomes.count(Outcome.DUPLICATE) == 20
    with psycopg.connect(dsn) as db:
        assert db.execute("SELECT COUNT(*), COUNT(DISTINCT order_id) FROM orders").fetchone() \
            == (20, 20)
        assert db.execute("SELECT COUNT(*) FROM ferry_ledger WHERE scene = 'billing' "
                          "AND consumer_group = %s", (GROUP,)).fetchone() == (20,)


async def test_any_wrap_object_is_a_check_and_other_objects_are_refused() -> None:
    class SkipOdd:
        def wrap(self, handler: Handler) -> Handler:
            async def wrapped(rec: ConsumerRecord) -> object:
                if (rec.key or "").endswith(("1", "3")):
                    raise DuplicateMessage(scene="x", biz_key=rec.key or "")
                if rec.key == "order-5":
                    return Outcome.DUPLICATE
                return await handler(rec)
            return wrapped

    async def handle(rec: ConsumerRecord) -> str:
        return "handled"

    stats = IdempotenceStats()
    wired = wire(handle, SkipOdd(), group=GROUP, stats=stats)
    for i in range(6):
        await wired(msg(f"order-{i}"))
    assert (stats.ran, stats.duplicates) == (3, 3)
    with pytest.raises(FerryError, match="idempotence="):
        wire(handle, "redis://localhost", group=GROUP, stats=stats)


async def test_sqlite_group_commit_rolls_back_only_the_failing_message(tmp_path: Path) -> None:
    """Messages handled together share one SQLite transaction, each in a savepoint."""
    path = tmp_path / "app.db"
    with closing(sqlite3.connect(path)) as db, db:
        db.execute("CREATE TABLE orders (order_id TEXT NOT NULL)")

    async def handle(rec: ConsumerRecord, conn: sqlite3.Connection) -> None:
        conn.execute("INSERT INTO orders VALUES (?)", (rec.key,))
        if rec.key == "order-3":
            raise RuntimeError("failed after the business write")

    async with Ledger().transactional(connect=lambda: sqlite3.connect(path, timeout=30)) as check:
        stats = IdempotenceStats()
        wired = wire(handle, check, group=GROUP, stats=stats)
        records = [msg(f"order-{i}") for i in range(8)]
        again = records[5]   # delivered twice in the same batch
        outcomes = await asyncio.gather(*(wired(r) for r in [*records, again]),
                                        return_exceptions=True)
    assert isinstance(outcomes[3], RuntimeError)
    assert outcomes.count(Outcome.RAN) == 7 and outcomes.count(Outcome.DUPLICATE) == 1
    with closing(sqlite3.connect(path)) as db:
        orders = sorted(r[0] for r in db.execute("SELECT order_id FROM orders"))
        keys = sorted(r[0] for r in db.execute("SELECT biz_key FROM ferry_ledger"))
    assert orders == keys == sorted(f"order-{i}" for i in range(8) if i != 3)
    assert (stats.ran, stats.duplicates, stats.failed) == (7, 1, 1)


async def test_claims_asked_in_one_turn_share_a_call_and_each_stays_atomic(
        redis_server: Redis) -> None:
    async with RedisClaim(redis_server.url, key_prefix=unique_prefix()) as claim:
        found = await asyncio.gather(*(claim.acquire("pay", key) for key in
                                       ["order-a", "order-b", "order-a"]))
        assert [c.state for c in found] == [ClaimState.CLAIMED, ClaimState.CLAIMED,
                                            ClaimState.PROCESSING]   # the 2nd order-a waits
        assert all(await asyncio.gather(*(claim.confirm(c) for c in found[:2])))
        assert not await claim.confirm(found[2])   # never ours
        again = await claim.acquire("pay", "order-a")
        assert again.state is ClaimState.DONE
        assert len({c.token for c in [*found, again]}) == 4   # one token per attempt


async def test_prepare_takes_a_batchs_claims_in_one_call_and_the_handlers_use_them(
        redis_server: Redis) -> None:
    """consumer.run awaits the hook's `prepare(batch)` before starting the batch's handlers."""
    runs: list[str] = []

    async def handle(record: ConsumerRecord) -> None:
        runs.append(record.msg_id)

    async with RedisClaim(redis_server.url, key_prefix=unique_prefix()) as claim:
        stats = IdempotenceStats()
        checked = wire(handle, claim, group=GROUP, stats=stats)
        batch = [msg("order-1"), msg("order-2"), msg("order-1"), msg()]
        await claim.acquire("warm-up", "x")   # the script is loaded in Redis (EVAL once)
        before = await _script_calls(claim)
        await _hook(checked).prepare(batch)
        assert await _script_calls(claim) == before + 1   # one round trip for the batch
        outcomes = []
        for record in batch:
            try:
                outcomes.append(await checked(record))
            except ClaimBusyError:   # the second order-1 of the batch: retried later
                outcomes.append("busy")
        assert outcomes == [Outcome.RAN, Outcome.RAN, "busy", Outcome.RAN]
        assert runs == [batch[0].msg_id, batch[1].msg_id, batch[3].msg_id]
        # Each handler used its prefetched claim: no acquire of its own (only confirms).
        assert await _script_calls(claim) <= before + 1 + 3
        assert (stats.ran, stats.busy) == (3, 1)
        # A duplicate delivered later finds "done" (prefetched or not).
        again = msg("order-2")
        await _hook(checked).prepare([again])
        assert await checked(again) is Outcome.DUPLICATE


async def _script_calls(claim: RedisClaim) -> int:
    info = await claim._redis.info("commandstats")
    return sum(int(v["calls"]) for k, v in info.items() if k in ("cmdstat_evalsha", "cmdstat_eval"))


def _hook(handler: object) -> BatchHook:
    hook = batch_hook(handler)
    assert hook is not None
    return hook


async def test_forget_releases_prefetched_claims_whose_handlers_never_ran(
        redis_server: Redis) -> None:
    """A stop or cancel between prefetch and the handlers: the claims are given back,
    so the redelivery runs at once instead of finding them busy for a whole lease."""
    async def handle(record: ConsumerRecord) -> None:
        return None

    async with RedisClaim(redis_server.url, key_prefix=unique_prefix()) as claim:
        checked = wire(handle, claim, group=GROUP, stats=IdempotenceStats())
        batch = [msg("order-7"), msg("order-8")]
        await _hook(checked).prepare(batch)
        assert await claim.state_of(GROUP, "order-7") == "processing"
        _hook(checked).forget(batch)
        for _ in range(100):
            if await claim.state_of(GROUP, "order-7") is None:
                break
            await asyncio.sleep(0.01)
        assert await claim.state_of(GROUP, "order-7") is None
        assert await claim.state_of(GROUP, "order-8") is None
        redelivered = msg("order-7")
        assert await checked(redelivered) is Outcome.RAN
