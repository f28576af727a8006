"""One small harness per connection type the ledger supports, so each scenario runs on all.

A harness opens a new connection, runs a block in a transaction (commit on
success, rollback when the block raises) and runs the business table's SQL,
written with `:name` parameters.
"""
from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiosqlite
import psycopg
import sqlalchemy as sa
from ferry.idempotence.ledger_sql import to_pyformat
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

from tests.support.procs import Postgres

BUSINESS_TABLE = "CREATE TABLE orders (order_id TEXT NOT NULL, amount INTEGER NOT NULL)"
SYNC_BACKENDS = ["sqlite3", "psycopg", "sqlalchemy-sqlite", "sqlalchemy-postgresql",
                 "sqlalchemy-session-postgresql"]
ASYNC_BACKENDS = ["aiosqlite", "psycopg-async", "sqlalchemy-async-sqlite",
                  "sqlalchemy-async-postgresql", "sqlalchemy-async-session-sqlite"]


@dataclass
class SyncBackend:
    name: str
    target: str             # a sqlite path or a postgres conninfo
    engine: Any = None      # SQLAlchemy Engine

    @contextlib.contextmanager
    def connect(self) -> Iterator[Any]:
        if self.name == "sqlite3":
            import sqlite3
            conn = sqlite3.connect(self.target, timeout=30)
            try:
                yield conn
            finally:
                conn.close()
        elif self.name == "psycopg":
            with psycopg.connect(self.target) as pg:
                yield pg
        elif "session" in self.name:
            with Session(self.engine) as session:
                yield session
        else:
            with self.engine.connect() as sa_conn:
                yield sa_conn

    @contextlib.contextmanager
    def transaction(self, conn: Any) -> Iterator[None]:
        if self.name == "sqlite3":
            with conn:
                yield
        elif self.name == "psycopg":
            with conn.transaction():
                yield
        else:
            with conn.begin():
                yield

    def execute(self, conn: Any, sql: str, params: dict[str, Any] | None = None) -> list[Any]:
        params = params or {}
        if self.name == "sqlite3":
            return list(conn.execute(sql, params).fetchall())
        if self.name == "psycopg":
            cur = conn.execute(to_pyformat(sql), params)
            return list(cur.fetchall()) if cur.description else []
        result = conn.execute(sa.text(sql), params)
        return list(result.fetchall()) if result.returns_rows else []

    def close(self) -> None:
        if self.engine is not None:
            self.engine.dispose()


@dataclass
class AsyncBackend:
    name: str
    target: str
    engine: Any = None      # SQLAlchemy AsyncEngine

    @contextlib.asynccontextmanager
    async def connect(self) -> AsyncIterator[Any]:
        if self.name == "aiosqlite":
            async with aiosqlite.connect(self.target, timeout=30) as conn:
                yield conn
        elif self.name == "psycopg-async":
            async with await psycopg.AsyncConnection.connect(self.target) as conn:
                yield conn
        elif "session" in self.name:
            async with AsyncSession(self.engine) as session:
                yield session
        else:
            async with self.engine.connect() as conn:
                yield conn

    @contextlib.asynccontextmanager
    async def transaction(self, conn: Any) -> AsyncIterator[None]:
        if self.name == "aiosqlite":
            try:
                yield
            except BaseException:
                await conn.rollback()
                raise
            await conn.commit()
        elif self.name == "psycopg-async":
            async with conn.transaction():
                yield
        else:
            async with conn.begin():
                yield

    async def execute(self, conn: Any, sql: str, params: dict[str, Any] | None = None) -> list[Any]:
        params = params or {}
        if self.name == "aiosqlite":
            async with conn.execute(sql, params) as cur:
                return list(await cur.fetchall())
        if self.name == "psycopg-async":
            cur = await conn.execute(to_pyformat(sql), params)
            return list(await cur.fetchall()) if cur.description else []
        result = await conn.execute(sa.text(sql), params)
        return list(result.fetchall()) if result.returns_rows else []

    async def close(self) -> None:
        if self.engine is not None:
            await self.engine.dispose()


def pg_conninfo(server: Postgres, database: str) -> str:
    return f"postgresql://postgres@{server.host}:{server.port}/{database}"


def make_sync(name: str, tmp_path: Path, server: Postgres | None, database: str) -> SyncBackend:
    if name == "sqlite3":
        backend = SyncBackend(name, str(tmp_path / "app.db"))
    elif name == "psycopg":
        assert server is not None
        backend = SyncBackend(name, pg_conninfo(server, database))
    elif name == "sqlalchemy-sqlite":
        backend = SyncBackend(name, "", sa.create_engine(
            f"sqlite:///{tmp_path / 'app.db'}", connect_args={"timeout": 30}))
    else:   # sqlalchemy-postgresql and sqlalchemy-session-postgresql
        assert server is not None
        backend = SyncBackend(name, "", sa.create_engine(
            f"postgresql+psycopg://postgres@{server.host}:{server.port}/{database}"))
    with backend.connect() as conn, backend.transaction(conn):
        backend.execute(conn, BUSINESS_TABLE)
    return backend


async def make_async(name: str, tmp_path: Path, server: Postgres | None,
                     database: str) -> AsyncBackend:
    if name == "aiosqlite":
        backend = AsyncBackend(name, str(tmp_path / "app.db"))
    elif name == "psycopg-async":
        assert server is not None
        backend = AsyncBackend(name, pg_conninfo(server, database))
    elif name in ("sqlalchemy-async-sqlite", "sqlalchemy-async-session-sqlite"):
        backend = AsyncBackend(name, "", create_async_engine(
            f"sqlite+aiosqlite:///{tmp_path / 'app.db'}", connect_args={"timeout": 30}))
    else:
        assert server is not None
        backend = AsyncBackend(name, "", create_async_engine(
            f"postgresql+psycopg://postgres@{server.host}:{server.port}/{database}"))
    async with backend.connect() as conn, backend.transaction(conn):
        await backend.execute(conn, BUSINESS_TABLE)
    return backend
