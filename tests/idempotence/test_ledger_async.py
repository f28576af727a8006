"""The ledger (strong check) on asyncio connections: aiosqlite, psycopg's AsyncConnection
and SQLAlchemy's AsyncConnection on SQLite and on a real throwaway PostgreSQL.

The same scenarios as test_ledger.py; with an asyncio connection every
ledger call is awaited.
"""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from ferry.idempotence import DuplicateMessage, Ledger, LedgerEntry

from tests.idempotence.backends import ASYNC_BACKENDS, AsyncBackend, make_async
from tests.idempotence.test_ledger import Msg

pytestmark = pytest.mark.integration


@pytest.fixture(params=ASYNC_BACKENDS)
async def backend(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[AsyncBackend]:
    server, database = None, ""
    if "sqlite" not in request.param:
        server = request.getfixturevalue("postgres")
        database = request.getfixturevalue("pg_database")
    b = await make_async(request.param, tmp_path, server, database)
    yield b
    await b.close()


async def handle(backend: AsyncBackend, ledger: Ledger, msg: Msg, *, fail: bool = False) -> None:
    """A handler: the business row, the ledger row, then commit (or fail before it)."""
    async with backend.connect() as conn, backend.transaction(conn):
        await backend.execute(conn, "INSERT INTO orders (order_id, amount) VALUES (:o, :a)",
                              {"o": msg.key or msg.msg_id, "a": 250})
        await ledger.record(conn, scene="billing", record=msg, amount=250)
        if fail:
            raise RuntimeError("handler failed after its business write")


async def counts(backend: AsyncBackend, ledger: Ledger) -> tuple[int, int]:
    async with backend.connect() as conn, backend.transaction(conn):
        orders = (await backend.execute(conn, "SELECT COUNT(*) FROM orders"))[0][0]
        rows = (await backend.execute(conn, f"SELECT COUNT(*) FROM {ledger.table}"))[0][0]
    return int(orders), int(rows)


async def create_schema(backend: AsyncBackend, ledger: Ledger) -> None:
    async with backend.connect() as conn, backend.transaction(conn):
        await ledger.create_schema(conn)


async def test_first_record_commits_with_the_business_row(backend: AsyncBackend) -> None:
    ledger = Ledger(group="billing-group")
    msg = Msg("AB" * 16, key="order-1")
    await handle(backend, ledger, msg)
    assert await counts(backend, ledger) == (1, 1)
    async with backend.connect() as conn, backend.transaction(conn):
        entry = await ledger.by_biz_key(conn, scene="billing", biz_key="order-1")
        assert isinstance(entry, LedgerEntry)
        assert (entry.msg_id, entry.group, entry.queue_offset, entry.amount) == (
            msg.msg_id, "billing-group", 7, 250)
        assert await ledger.by_msg_id(conn, msg.msg_id) == [entry]


async def test_duplicate_raises_and_the_rollback_keeps_one_of_each(
        backend: AsyncBackend) -> None:
    ledger = Ledger()
    await handle(backend, ledger, Msg("CD" * 16, key="order-2"))
    with pytest.raises(DuplicateMessage):
        await handle(backend, ledger, Msg("EF" * 16, key="order-2"))
    assert await counts(backend, ledger) == (1, 1)


async def test_failure_before_commit_leaves_nothing_and_the_retry_succeeds(
        backend: AsyncBackend) -> None:
    ledger = Ledger()
    await create_schema(backend, ledger)
    msg = Msg("01" * 16)
    with pytest.raises(RuntimeError):
        await handle(backend, ledger, msg, fail=True)
    assert await counts(backend, ledger) == (0, 0)
    await handle(backend, ledger, msg)
    assert await counts(backend, ledger) == (1, 1)


async def test_concurrent_duplicates_exactly_one_wins(backend: AsyncBackend) -> None:
    ledger = Ledger()
    await create_schema(backend, ledger)

    async def racer(msg_id: str, both_in: asyncio.Barrier) -> str:
        async with backend.connect() as conn:
            await both_in.wait()
            try:
                async with backend.transaction(conn):
                    await backend.execute(conn, "INSERT INTO orders (order_id, amount) "
                                                "VALUES (:o, 1)", {"o": "order-race"})
                    await ledger.record(conn, scene="billing",
                                        record=Msg(msg_id, key="order-race"))
            except DuplicateMessage:
                return "duplicate"
            return "recorded"

    barrier = asyncio.Barrier(2)
    outcomes = await asyncio.wait_for(
        asyncio.gather(racer("1" * 32, barrier), racer("2" * 32, barrier)), 60)
    assert sorted(outcomes) == ["duplicate", "recorded"]
    assert await counts(backend, ledger) == (1, 1)


async def test_lookups_and_first_use_schema(backend: AsyncBackend) -> None:
    ledger = Ledger(table="ledger_lookups")
    msg = Msg("9A" * 16, key="k-1")
    async with backend.connect() as conn, backend.transaction(conn):
        assert await ledger.by_msg_id(conn, msg.msg_id) == []
        assert await ledger.by_biz_key(conn, scene="billing", biz_key="k-1") is None
    async with backend.connect() as conn, backend.transaction(conn):
        await ledger.record(conn, scene="billing", record=msg)   # creates the table
        await ledger.record(conn, scene="points", record=msg, biz_key="u-7:k-1")
    async with backend.connect() as conn, backend.transaction(conn):
        found = await ledger.by_msg_id(conn, msg.msg_id)
        assert [(e.scene, e.biz_key) for e in found] == [("billing", "k-1"), ("points", "u-7:k-1")]
        assert await ledger.by_biz_key(conn, scene="points", biz_key="k-1") is None
