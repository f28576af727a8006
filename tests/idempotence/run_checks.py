"""The three checks the redelivery tests run, built the same way in the test and in its child.

`Setup` names where the check keeps its state (a SQLite file, a PostgreSQL
database, a Redis key prefix); `make_check` returns the check, the handler
`consumer.run` gets, and a closer. The business effect is a row in `orders`
(ledger kinds) or a count per message id in a Redis hash (claim kind), so it
survives the kill of the process that did it.
"""
from __future__ import annotations

import sqlite3
from collections.abc import Awaitable, Callable
from contextlib import closing
from dataclasses import dataclass
from typing import Any

import psycopg
import redis.asyncio as aioredis
from ferry.client.core.message import ConsumerRecord
from ferry.idempotence import Ledger, RedisClaim, biz_key_of

KINDS = ("sqlite", "postgres", "redis")
ORDERS = "CREATE TABLE orders (order_id TEXT NOT NULL, msg_id TEXT NOT NULL)"


@dataclass(frozen=True)
class Setup:
    kind: str      # one of KINDS
    target: str    # SQLite path, PostgreSQL conninfo or Redis URL
    prefix: str = ""   # Redis key prefix (claim kind)

    @property
    def runs_key(self) -> str:
        return f"{self.prefix}:runs"


def sqlite_connect(path: str) -> Callable[[], sqlite3.Connection]:
    def connect() -> sqlite3.Connection:
        conn = sqlite3.connect(path, timeout=30)
        # WAL: readers (the test's checks) do not block the writer. A kill -9 of
        # the process keeps every commit (the OS has the pages) at synchronous=NORMAL.
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        return conn
    return connect


def create_business_table(setup: Setup) -> None:
    if setup.kind == "sqlite":
        with closing(sqlite_connect(setup.target)()) as db, db:
            db.execute(ORDERS)
    elif setup.kind == "postgres":
        with psycopg.connect(setup.target, autocommit=True) as pg:
            pg.execute(ORDERS)


def make_check(setup: Setup) -> tuple[Any, Callable[..., Awaitable[Any]],
                                      Callable[[], Awaitable[None]]]:
    """(check for `idempotence=`, handler, async closer)."""
    if setup.kind == "redis":
        claim = RedisClaim(setup.target, key_prefix=setup.prefix)
        counts = aioredis.Redis.from_url(setup.target)

        async def count_run(rec: ConsumerRecord) -> None:
            await counts.hincrby(setup.runs_key, rec.msg_id, 1)

        async def close_claim() -> None:
            await claim.aclose()
            await counts.aclose()
        return claim, count_run, close_claim
    if setup.kind == "sqlite":
        check = Ledger().transactional(connect=sqlite_connect(setup.target))

        async def insert_sqlite(rec: ConsumerRecord, conn: sqlite3.Connection) -> None:
            conn.execute("INSERT INTO orders VALUES (?, ?)", (biz_key_of(rec), rec.msg_id))
        return check, insert_sqlite, check.aclose
    dsn = setup.target
    check = Ledger().transactional(connect=lambda: psycopg.AsyncConnection.connect(dsn))

    async def insert_pg(rec: ConsumerRecord, conn: psycopg.AsyncConnection[Any]) -> None:
        await conn.execute("INSERT INTO orders VALUES (%s, %s)", (biz_key_of(rec), rec.msg_id))
    return check, insert_pg, check.aclose


def business_rows(setup: Setup) -> list[tuple[str, str]]:
    """Every (order_id, msg_id) business row, duplicates included."""
    if setup.kind == "sqlite":
        with closing(sqlite_connect(setup.target)()) as db:
            return [tuple(r) for r in db.execute("SELECT order_id, msg_id FROM orders")]
    with psycopg.connect(setup.target) as pg:
        return [tuple(r) for r in pg.execute("SELECT order_id, msg_id FROM orders")]


def ledger_rows(setup: Setup, scene: str) -> list[tuple[str, str, str]]:
    """Every (biz_key, msg_id, consumer_group) ledger row of `scene`."""
    sql = "SELECT biz_key, msg_id, consumer_group FROM ferry_ledger WHERE scene = "
    if setup.kind == "sqlite":
        with closing(sqlite_connect(setup.target)()) as db:
            return [tuple(r) for r in db.execute(sql + "?", (scene,))]
    with psycopg.connect(setup.target) as pg:
        return [tuple(r) for r in pg.execute(sql + "%s", (scene,))]
