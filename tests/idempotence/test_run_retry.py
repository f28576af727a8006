"""Failures through `consumer.run(handler, idempotence=...)`, on a real mesh with the delay scheduler.

Retries take the real path: nack -> SEND_BACK -> `%SCHEDULE%` -> the delay
scheduler -> `%RETRY%<group>`, with a short back-off from the group's retry
policy. A handler failing after its business write leaves neither the
business row nor the ledger row, and its retry leaves exactly one of each;
Redis down under policy FAIL nacks the message (retried, not skipped), under
PROCESS runs it unchecked and counts it. Also the `async for` pattern: the
ledger row in the loop's own transaction, then commit.
"""
from __future__ import annotations

import asyncio
import shutil
import sqlite3
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import psycopg
import pytest
from ferry import Admin, Consumer, ConsumerRecord, Message, Producer
from ferry.idempotence import (
    DuplicateMessage,
    IdempotenceStats,
    Ledger,
    RedisClaim,
    RedisUnavailablePolicy,
)

from tests.client.conftest import Mesh, start_mesh, unique
from tests.client.util import FAST
from tests.delay_scheduler.conftest import SchedulerProc, start_scheduler
from tests.idempotence.backends import pg_conninfo
from tests.idempotence.conftest import unique_prefix
from tests.support.procs import Etcd, Postgres, Proc, free_port, spawn, wait_for_port

pytestmark = pytest.mark.integration

BACKOFF_MS = [300]   # every retry comes back after 300 ms, through the delay scheduler
DEADLINE_S = 30.0
ORDERS = "CREATE TABLE orders (order_id TEXT NOT NULL)"


@pytest.fixture(scope="module")
def mesh(etcd: Etcd, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mesh]:
    m = start_mesh(etcd, tmp_path_factory.mktemp("retry-mesh"), broker_names=("broker-a",))
    scheduler: SchedulerProc | None = None
    try:
        scheduler = start_scheduler(m, "idem-scheduler")
        yield m
    finally:
        if scheduler is not None:
            scheduler.proc.stop()
        m.stop()


async def _topic_with_one_message(mesh: Mesh, key: str) -> tuple[str, str]:
    topic, group = unique("idem-retry"), unique("g")
    async with Admin(namesrv=mesh.namesrv) as admin:
        await admin.create_group(group, retry_backoff_ms=BACKOFF_MS, consume_from="earliest")
    async with Producer(namesrv=mesh.namesrv) as producer:
        await producer.send_and_wait(topic, b"pay 250", key=key)
    return topic, group


async def _run_until(mesh: Mesh, topic: str, group: str, handler: Any, check: object,
                     until: Callable[[IdempotenceStats], bool]) -> IdempotenceStats:
    """`consumer.run(handler, idempotence=check)` until `until(stats)`, then 1 s more."""
    async with Consumer(topic, group=group, namesrv=mesh.namesrv, **FAST) as consumer:
        running = asyncio.create_task(consumer.run(handler, concurrency=2, idempotence=check))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + DEADLINE_S
        while consumer.idempotence_stats is None or not until(consumer.idempotence_stats):
            assert loop.time() < deadline, f"stuck at {consumer.idempotence_stats}"
            await asyncio.sleep(0.05)
        await asyncio.sleep(1.0)   # nothing more may arrive: no extra run, no extra nack
        await consumer.stop()
        await running
        assert consumer.idempotence_stats is not None
        return consumer.idempotence_stats


# -- a handler failing after its business write, before commit -----------------------------

def _sqlite_counts(path: Path) -> tuple[int, int]:
    with closing(sqlite3.connect(path)) as db:
        orders = db.execute("SELECT COUNT(*) FROM orders").fetchone()[0]
        entry = Ledger().by_biz_key(db, scene="billing", biz_key="order-7")
    return int(orders), int(entry is not None)


async def test_failure_after_the_business_write_leaves_nothing_plain_ledger_sqlite(
        mesh: Mesh, tmp_path: Path) -> None:
    topic, group = await _topic_with_one_message(mesh, "order-7")
    path = tmp_path / "app.db"
    with closing(sqlite3.connect(path)) as db, db:
        db.execute(ORDERS)
    conn = sqlite3.connect(path)
    ledger = Ledger(group=group)
    seen: list[tuple[int, tuple[int, int]]] = []

    async def handle(rec: ConsumerRecord) -> None:
        seen.append((rec.reconsume_times, _sqlite_counts(path)))
        with conn:   # the business write and the ledger row: one transaction
            conn.execute("INSERT INTO orders VALUES (?)", (rec.key,))
            ledger.record(conn, scene="billing", record=rec)
            if rec.reconsume_times == 0:
                raise RuntimeError("crashed after the business write, before commit")

    stats = await _run_until(mesh, topic, group, handle, ledger, lambda s: s.ran == 1)
    conn.close()
    # The first attempt left nothing behind; the retry (attempt 1) recorded both once.
    assert seen == [(0, (0, 0)), (1, (0, 0))]
    assert _sqlite_counts(path) == (1, 1)
    assert (stats.failed, stats.ran, stats.duplicates) == (1, 1, 0)


async def test_failure_after_the_business_write_leaves_nothing_transactional_postgres(
        mesh: Mesh, postgres: Postgres, pg_database: str) -> None:
    topic, group = await _topic_with_one_message(mesh, "order-7")
    dsn = pg_conninfo(postgres, pg_database)
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute(ORDERS)

    def counts() -> tuple[int, int]:
        with psycopg.connect(dsn) as db:
            orders = db.execute("SELECT COUNT(*) FROM orders").fetchone()
            entry = Ledger().by_biz_key(db, scene=group, biz_key="order-7")
        return int(orders[0] if orders else 0), int(entry is not None)

    seen: list[tuple[int, tuple[int, int]]] = []

    async def handle(rec: ConsumerRecord, conn: psycopg.AsyncConnection[Any]) -> None:
        # The ledger row is in this transaction already; the business write follows.
        seen.append((rec.reconsume_times, await asyncio.to_thread(counts)))
        await conn.execute("INSERT INTO orders VALUES (%s)", (rec.key,))
        if rec.reconsume_times == 0:
            raise RuntimeError("crashed after the business write, before commit")

    async with Ledger().transactional(
            connect=lambda: psycopg.AsyncConnection.connect(dsn)) as check:
        stats = await _run_until(mesh, topic, group, handle, check, lambda s: s.ran == 1)
    assert seen == [(0, (0, 0)), (1, (0, 0))]
    assert counts() == (1, 1)
    assert (stats.failed, stats.ran, stats.duplicates) == (1, 1, 0)


# -- Redis down, through consumer.run ---------------------------------------------------------

@pytest.fixture
def redis_later(tmp_path: Path) -> Iterator[tuple[int, Callable[[], Proc]]]:
    """A port where no Redis runs yet, and how to start one there."""
    port, started = free_port(), []

    def start() -> Proc:
        binary = shutil.which("redis-server")
        assert binary is not None, "redis-server is not installed: run `make setup`"
        proc = spawn("redis-later", [binary, "--port", str(port), "--bind", "127.0.0.1",
                                     "--dir", str(tmp_path), "--save", "",
                                     "--appendonly", "no"], tmp_path)
        started.append(proc)
        wait_for_port("127.0.0.1", port)
        return proc

    yield port, start
    for proc in started:
        proc.stop()


async def test_redis_down_under_policy_fail_nacks_and_the_retry_runs_it(
        mesh: Mesh, redis_later: tuple[int, Callable[[], Proc]]) -> None:
    port, start_redis_now = redis_later
    topic, group = await _topic_with_one_message(mesh, "order-8")
    runs: list[int] = []

    async def handle(rec: ConsumerRecord) -> None:
        runs.append(rec.reconsume_times)

    async with RedisClaim(f"redis://127.0.0.1:{port}/0", key_prefix=unique_prefix()) as claim:
        async with Consumer(topic, group=group, namesrv=mesh.namesrv, **FAST) as consumer:
            running = asyncio.create_task(consumer.run(handle, idempotence=claim))
            await _until(lambda: consumer.idempotence_stats is not None
                         and consumer.idempotence_stats.unavailable >= 1)
            assert runs == []   # not run, and not skipped: nacked for a retry
            start_redis_now()
            await _until(lambda: runs != [])
            await asyncio.sleep(1.0)
            await consumer.stop()
            await running
            stats = consumer.idempotence_stats
        assert await claim.state_of(group, "order-8") == "done"
    assert len(runs) == 1 and runs[0] >= 1   # ran once, on a retry
    assert stats is not None and stats.ran == 1 and stats.duplicates == 0
    assert stats.unavailable == runs[0]       # each earlier attempt failed for the retry


async def test_redis_down_under_policy_process_runs_unchecked_and_counts(
        mesh: Mesh, redis_later: tuple[int, Callable[[], Proc]]) -> None:
    port, _ = redis_later   # never started
    topic, group = await _topic_with_one_message(mesh, "order-9")
    runs: list[int] = []

    async def handle(rec: ConsumerRecord) -> None:
        runs.append(rec.reconsume_times)

    async with RedisClaim(f"redis://127.0.0.1:{port}/0", key_prefix=unique_prefix(),
                          on_unavailable=RedisUnavailablePolicy.PROCESS) as claim:
        stats = await _run_until(mesh, topic, group, handle, claim, lambda s: s.ran == 1)
        assert claim.stats.unavailable_unchecked == 1
    assert runs == [0]   # ran at once, not nacked
    assert (stats.ran, stats.unchecked, stats.unavailable, stats.failed) == (1, 1, 0, 0)


async def _until(check: Callable[[], bool], timeout_s: float = DEADLINE_S) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not check():
        assert loop.time() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)


# -- async for: the ledger in the loop's own transaction, then commit -------------------------

@pytest.fixture
async def app_db(tmp_path: Path) -> AsyncIterator[sqlite3.Connection]:
    conn = sqlite3.connect(tmp_path / "app.db")
    with conn:
        conn.execute(ORDERS)
    yield conn
    conn.close()


async def test_async_for_with_the_ledger_in_the_loops_transaction(
        mesh: Mesh, app_db: sqlite3.Connection) -> None:
    topic, group = unique("idem-for"), unique("g")
    count = 40
    async with Producer(namesrv=mesh.namesrv) as producer:
        await producer.send_batch(topic, [Message(f"m{i}".encode(), key=f"order-{i}")
                                          for i in range(count)])
    ledger = Ledger(group=group)
    handled = duplicates = 0
    async with Consumer(topic, group=group, namesrv=mesh.namesrv,
                        auto_offset_reset="earliest", enable_auto_commit=False,
                        **FAST) as consumer:
        async for rec in consumer:   # the documented pattern
            try:
                with app_db:
                    app_db.execute("INSERT INTO orders VALUES (?)", (rec.key,))
                    ledger.record(app_db, scene="billing", record=rec)
                handled += 1
            except DuplicateMessage:
                duplicates += 1   # processed before: acknowledge it
            if handled + duplicates == count:   # every message seen: redeliver all of them
                for tq in consumer.assignment():
                    await consumer.seek(tq, 0)
            if handled + duplicates == 2 * count:
                await consumer.commit()
                break
    assert (handled, duplicates) == (count, count)
    assert app_db.execute("SELECT COUNT(*), COUNT(DISTINCT order_id) FROM orders").fetchone() \
        == (count, count)
