"""Telling the caller's connection apart and running one statement on it, sync or async.

The ledger takes whatever connection the caller's business code already
holds: `sqlite3.Connection`, `aiosqlite.Connection`, `psycopg.Connection` /
`psycopg.AsyncConnection`, or SQLAlchemy's `Connection` / `AsyncConnection` /
ORM `Session` / `AsyncSession` (on SQLite or PostgreSQL). The drivers are optional: a type is only checked
against a driver already imported by the caller (it made the connection).
"""
from __future__ import annotations

import sqlite3
import sys
from dataclasses import dataclass
from typing import Any

from ferry.errors import FerryError
from ferry.idempotence.ledger_sql import POSTGRES, SQLITE, to_pyformat

SQLITE3 = "sqlite3"
AIOSQLITE = "aiosqlite"
PSYCOPG = "psycopg"
SQLALCHEMY = "sqlalchemy"

Row = tuple[Any, ...]


class LedgerUsageError(FerryError, ValueError):
    """The ledger was handed something it cannot use: an unknown connection, a bad
    name, or a connection in autocommit mode outside any transaction."""


@dataclass(frozen=True)
class Target:
    """What kind of connection the caller passed."""

    driver: str       # SQLITE3, AIOSQLITE, PSYCOPG or SQLALCHEMY
    dialect: str      # ledger_sql.SQLITE or ledger_sql.POSTGRES
    is_async: bool
    database: Any     # an object that stands for the database (schema cache key)


def _module(name: str) -> Any:
    return sys.modules.get(name)


def _sqlalchemy_dialect(name: str) -> str:
    if name == "sqlite":
        return SQLITE
    if name == "postgresql":
        return POSTGRES
    raise LedgerUsageError(f"ledger: SQLAlchemy dialect {name!r} is not supported "
                           "(sqlite and postgresql are)")


def _session_target(session: Any, *, is_async: bool) -> Target:
    """An ORM session runs the ledger's statements in its own transaction (`execute`)."""
    bind = session.get_bind()
    engine = getattr(bind, "engine", bind)   # bound to a Connection or to an Engine
    return Target(SQLALCHEMY, _sqlalchemy_dialect(engine.dialect.name), is_async, engine)


def detect(conn: Any) -> Target:
    """The kind of `conn`; LedgerUsageError if it is none the ledger knows."""
    if isinstance(conn, sqlite3.Connection):
        return Target(SQLITE3, SQLITE, False, None)
    aiosqlite = _module("aiosqlite")
    if aiosqlite is not None and isinstance(conn, aiosqlite.Connection):
        return Target(AIOSQLITE, SQLITE, True, None)
    psycopg = _module("psycopg")
    if psycopg is not None:
        if isinstance(conn, psycopg.AsyncConnection):
            return Target(PSYCOPG, POSTGRES, True, conn)
        if isinstance(conn, psycopg.Connection):
            return Target(PSYCOPG, POSTGRES, False, conn)
    sa_async = _module("sqlalchemy.ext.asyncio")
    if sa_async is not None and isinstance(conn, sa_async.AsyncConnection):
        return Target(SQLALCHEMY, _sqlalchemy_dialect(conn.dialect.name), True,
                      conn.sync_engine)
    if sa_async is not None and isinstance(conn, sa_async.AsyncSession):
        return _session_target(conn.sync_session, is_async=True)
    sa_orm = _module("sqlalchemy.orm")
    if sa_orm is not None and isinstance(conn, sa_orm.Session):
        return _session_target(conn, is_async=False)
    sa_engine = _module("sqlalchemy.engine")
    if sa_engine is not None and isinstance(conn, sa_engine.Connection):
        return Target(SQLALCHEMY, _sqlalchemy_dialect(conn.dialect.name), False, conn.engine)
    raise LedgerUsageError(
        f"ledger: unsupported connection type {type(conn).__module__}.{type(conn).__qualname__} "
        "(use sqlite3, aiosqlite, psycopg 3, or a SQLAlchemy Connection, AsyncConnection, "
        "Session or AsyncSession)")


def require_transaction(target: Target, conn: Any) -> None:
    """Refuse a connection whose insert would commit at once, alone (autocommit, no
    transaction open): the ledger row must commit with the business change or not at all."""
    if target.driver in (SQLITE3, AIOSQLITE):
        autocommit = conn.isolation_level is None
        in_txn = bool(conn.in_transaction)
    elif target.driver == PSYCOPG:
        autocommit = bool(conn.autocommit)
        in_txn = int(conn.info.transaction_status) != 0  # 0 = IDLE
    else:
        return  # SQLAlchemy 2 always runs statements in a transaction (autobegin)
    if autocommit and not in_txn:
        raise LedgerUsageError(
            "ledger: the connection is in autocommit mode with no open transaction, so the "
            "ledger row would commit alone; open a transaction around the business change")


def _rows_of_cursor(cursor: Any) -> list[Row]:
    return [tuple(r) for r in cursor.fetchall()] if cursor.description else []


def run_sync(target: Target, conn: Any, sql: str, params: dict[str, Any]) -> list[Row]:
    """Run one statement on a sync connection; its rows (none for a write)."""
    if target.driver == SQLITE3:
        return _rows_of_cursor(conn.execute(sql, params))
    if target.driver == PSYCOPG:
        with conn.cursor() as cur:
            cur.execute(to_pyformat(sql), params)
            return _rows_of_cursor(cur)
    from sqlalchemy import text
    result = conn.execute(text(sql), params)
    return [tuple(r) for r in result.fetchall()] if result.returns_rows else []


async def run_async(target: Target, conn: Any, sql: str, params: dict[str, Any]) -> list[Row]:
    """Run one statement on an asyncio connection; its rows (none for a write)."""
    if target.driver == AIOSQLITE:
        async with conn.execute(sql, params) as cur:
            return [tuple(r) for r in await cur.fetchall()] if cur.description else []
    if target.driver == PSYCOPG:
        async with conn.cursor() as cur:
            await cur.execute(to_pyformat(sql), params)
            return [tuple(r) for r in await cur.fetchall()] if cur.description else []
    from sqlalchemy import text
    result = await conn.execute(text(sql), params)
    return [tuple(r) for r in result.fetchall()] if result.returns_rows else []
