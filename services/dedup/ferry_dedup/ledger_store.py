"""The service's reads of the ledger table: look-ups and the rows reconciliation compares.

The table is the one `ferry.idempotence.Ledger` writes (its schema and
column list are taken from there). The service only reads it, plus creating
the schema at start (idempotent). Each call runs in a worker thread on a
connection of its own (sqlite3 for `sqlite:///PATH`, psycopg 3 for
`postgresql://`), opened and closed around the call: the service keeps
nothing open that a database restart could break, and a database that is
away fails that call only (`LedgerUnavailableError`, HTTP 503).
"""
from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from ferry.errors import StoreUnavailableError
from ferry.idempotence import Ledger, LedgerEntry
from ferry.idempotence.ledger_conn import detect, run_sync
from ferry.idempotence.ledger_sql import COLUMNS, LedgerSQL

from ferry_dedup.config import POSTGRES_URL_PREFIXES, SQLITE_URL_PREFIX

T = TypeVar("T")
# Ids per `IN (...)` query: far below SQLite's 32,766 bound on parameters.
IN_BATCH = 500


class LedgerUnavailableError(StoreUnavailableError):
    """The ledger database could not be reached or failed: HTTP 503, retry later."""


class LedgerStore:
    """Reads of one ledger table at one database URL."""

    def __init__(self, url: str, table: str, timeout_ms: int) -> None:
        self.url = url
        self.ledger = Ledger(table=table)
        self.table = table
        self.timeout_ms = timeout_ms
        self.dialect = "sqlite" if url.startswith(SQLITE_URL_PREFIX) else "postgresql"

    # -- connections --------------------------------------------------------------------
    def _connect(self) -> Any:
        if self.url.startswith(SQLITE_URL_PREFIX):
            return sqlite3.connect(self.url[len(SQLITE_URL_PREFIX):],
                                   timeout=self.timeout_ms / 1000)
        if self.url.startswith(POSTGRES_URL_PREFIXES):
            import psycopg
            return psycopg.connect(self.url, connect_timeout=max(1, self.timeout_ms // 1000))
        raise LedgerUnavailableError(f"unsupported ledger URL {self.url!r}")

    def _with_conn(self, fn: Callable[[Any], T]) -> T:
        try:
            conn = self._connect()
        except Exception as exc:
            raise LedgerUnavailableError(f"ledger database unreachable: {exc}") from exc
        try:
            result = fn(conn)
            conn.commit()
            return result
        except LedgerUnavailableError:
            raise
        except Exception as exc:
            raise LedgerUnavailableError(f"ledger query failed: {type(exc).__name__}: "
                                         f"{exc}") from exc
        finally:
            conn.close()

    async def _run(self, fn: Callable[[Any], T]) -> T:
        return await asyncio.to_thread(self._with_conn, fn)

    # -- schema and health --------------------------------------------------------------
    async def create_schema(self) -> None:
        """Create the table and its indexes if missing (what consumers' first use does too)."""
        await self._run(self.ledger.create_schema)

    async def ping(self) -> None:
        await self._run(lambda conn: conn.execute("SELECT 1").fetchall())

    # -- look-ups -----------------------------------------------------------------------
    async def by_biz_key(self, scene: str, biz_key: str) -> LedgerEntry | None:
        return await self._run(lambda conn: self.ledger.by_biz_key(conn, scene=scene,
                                                                   biz_key=biz_key))

    async def by_msg_id(self, msg_id: str) -> list[LedgerEntry]:
        return await self._run(lambda conn: list(self.ledger.by_msg_id(conn, msg_id)))

    # -- what reconciliation reads ------------------------------------------------------
    async def rows_in_window(self, topic: str, group: str, scene: str, from_ms: int,
                             to_ms: int) -> list[LedgerEntry]:
        """Rows of (topic, scene) recorded in [from_ms, to_ms), written by `group` or by a
        ledger with no group (""), oldest first."""
        sql = (f"SELECT {', '.join(COLUMNS)} FROM {self.table} WHERE topic = :topic"
               " AND recorded_ms >= :from_ms AND recorded_ms < :to_ms AND scene = :scene"
               " AND consumer_group IN (:group, '') ORDER BY recorded_ms")
        params = {"topic": topic, "from_ms": from_ms, "to_ms": to_ms, "scene": scene,
                  "group": group}
        return await self._run(lambda conn: self._select(conn, sql, params))

    async def rows_by_msg_ids(self, scene: str, msg_ids: Iterable[str]) -> list[LedgerEntry]:
        """Rows of `scene` whose message id is one of `msg_ids` (any recording time)."""
        return await self._run(lambda conn: self._select_in(conn, scene, "msg_id", msg_ids))

    async def rows_by_biz_keys(self, scene: str, biz_keys: Iterable[str]) -> list[LedgerEntry]:
        """Rows of `scene` whose business key is one of `biz_keys`."""
        return await self._run(lambda conn: self._select_in(conn, scene, "biz_key", biz_keys))

    def _select_in(self, conn: Any, scene: str, column: str,
                   values: Iterable[str]) -> list[LedgerEntry]:
        todo = sorted(set(values))
        out: list[LedgerEntry] = []
        for start in range(0, len(todo), IN_BATCH):
            batch = todo[start:start + IN_BATCH]
            names = [f"v{i}" for i in range(len(batch))]
            sql = (f"SELECT {', '.join(COLUMNS)} FROM {self.table} WHERE scene = :scene"
                   f" AND {column} IN ({', '.join(':' + n for n in names)})")
            out.extend(self._select(conn, sql, {"scene": scene, **dict(zip(names, batch,
                                                                           strict=True))}))
        return out

    def _select(self, conn: Any, sql: str, params: dict[str, Any]) -> list[LedgerEntry]:
        target = detect(conn)
        if not run_sync(target, conn, LedgerSQL(target.dialect, self.table).table_exists(),
                        {"table_name": self.table}):
            return []   # never written to: no rows
        return [LedgerEntry.from_row(r) for r in run_sync(target, conn, sql, params)]
