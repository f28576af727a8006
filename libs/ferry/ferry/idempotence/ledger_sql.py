"""The ledger table's SQL, per dialect family (SQLite, PostgreSQL), and error classification.

Statements are written once with named `:param` placeholders (what sqlite3,
aiosqlite and SQLAlchemy's `text()` take as they are) and rendered to
psycopg's `%(param)s` style for psycopg connections. Nothing here touches a
connection: `ferry.idempotence.ledger_conn` runs these statements.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

SQLITE = "sqlite"
POSTGRES = "postgresql"

# Postgres' identifier limit is 63 bytes; the derived index names add up to 12.
TABLE_NAME_MAX_CHARS = 48
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_NAMED_PARAM = re.compile(r":([A-Za-z_][A-Za-z0-9_]*)")

# One column list for both dialects; only the integer and text types differ.
COLUMNS = ("scene", "biz_key", "msg_id", "topic", "consumer_group", "queue_id",
           "queue_offset", "recorded_ms", "amount")


def valid_table_name(name: str) -> bool:
    """Whether `name` is a plain SQL identifier the ledger can use unquoted."""
    return len(name) <= TABLE_NAME_MAX_CHARS and _IDENTIFIER.fullmatch(name) is not None


def to_pyformat(sql: str) -> str:
    """`:name` placeholders to psycopg's `%(name)s` (the ledger's SQL has no `::` casts)."""
    return _NAMED_PARAM.sub(r"%(\1)s", sql)


@dataclass(frozen=True)
class LedgerSQL:
    """Every statement the ledger runs against one table in one dialect family."""

    dialect: str
    table: str

    @property
    def unique_name(self) -> str:
        """The name of the (scene, biz_key) primary key: how a duplicate is told apart."""
        return f"{self.table}_scene_biz_key"

    def schema(self) -> list[str]:
        """CREATE statements, each idempotent (IF NOT EXISTS), in order."""
        big = "INTEGER" if self.dialect == SQLITE else "BIGINT"
        t = self.table
        return [
            f"CREATE TABLE IF NOT EXISTS {t} ("
            " scene TEXT NOT NULL,"
            " biz_key TEXT NOT NULL,"
            " msg_id TEXT NOT NULL,"
            " topic TEXT NOT NULL,"
            " consumer_group TEXT NOT NULL,"
            " queue_id INTEGER NOT NULL,"
            f" queue_offset {big} NOT NULL,"
            f" recorded_ms {big} NOT NULL,"
            f" amount {big},"
            f" CONSTRAINT {self.unique_name} PRIMARY KEY (scene, biz_key))",
            f"CREATE INDEX IF NOT EXISTS {t}_msg_id ON {t} (msg_id)",
            f"CREATE INDEX IF NOT EXISTS {t}_topic_time ON {t} (topic, recorded_ms)",
        ]

    def schema_lock(self) -> str | None:
        """Postgres: a transaction-scoped advisory lock taken before creating the schema.

        Two transactions creating the same table at once would otherwise race in
        the catalog (one fails with a unique violation on pg_type); with the lock
        the second waits, then finds the table (IF NOT EXISTS).
        """
        if self.dialect != POSTGRES:
            return None
        return "SELECT pg_advisory_xact_lock(hashtext(:lock_name))"

    def table_exists(self) -> str:
        if self.dialect == SQLITE:
            return "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = :table_name"
        return "SELECT 1 WHERE to_regclass(:table_name) IS NOT NULL"

    def insert(self) -> str:
        cols = ", ".join(COLUMNS)
        values = ", ".join(f":{c}" for c in COLUMNS)
        return f"INSERT INTO {self.table} ({cols}) VALUES ({values})"

    def select_by_biz_key(self) -> str:
        return (f"SELECT {', '.join(COLUMNS)} FROM {self.table}"
                " WHERE scene = :scene AND biz_key = :biz_key")

    def select_by_msg_id(self) -> str:
        return (f"SELECT {', '.join(COLUMNS)} FROM {self.table}"
                " WHERE msg_id = :msg_id ORDER BY scene, biz_key")


def _chain(exc: BaseException) -> list[BaseException]:
    """`exc`, the DBAPI error SQLAlchemy wraps (`.orig`) and the causes, outermost first."""
    out: list[BaseException] = []
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop()
        if e is None or any(e is seen for seen in out):
            continue
        out.append(e)
        todo.extend([getattr(e, "orig", None), e.__cause__])
    return out


def is_duplicate(exc: BaseException, sql: LedgerSQL) -> bool:
    """Whether `exc` is the ledger's own (scene, biz_key) unique violation, and nothing else.

    Another integrity error (a NOT NULL, the caller's own constraint, the
    catalog race of two CREATE TABLEs) is not a duplicate message.
    """
    for e in _chain(exc):
        sqlstate = getattr(e, "sqlstate", None) or getattr(e, "pgcode", None)
        if sqlstate is not None:
            diag: Any = getattr(e, "diag", None)
            name = getattr(diag, "constraint_name", None)
            return bool(sqlstate == "23505" and name == sql.unique_name)
        text = str(e)
        if f"UNIQUE constraint failed: {sql.table}.scene, {sql.table}.biz_key" in text:
            return True
    return False


def is_missing_table(exc: BaseException, sql: LedgerSQL) -> bool:
    """SQLite: whether `exc` says the ledger table does not exist (yet)."""
    return any(f"no such table: {sql.table}" in str(e) for e in _chain(exc))
