"""The wiring of `consumer.run(handler, idempotence=...)`, called directly with stand-in records.

Each kind of check (RedisClaim, Ledger, ledger.transactional, a wrap() object)
on real Redis, SQLite and PostgreSQL; the consumer itself is exercised by the
integration tests (test_run_*.py).
"""
from __future__ import annotations

import asyncio
import sqlite3
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import psycopg
import pytest
from ferry.client.message import ConsumerRecord
from ferry.errors import FerryError
from ferry.idempotence import (
    ClaimBusyError,
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
