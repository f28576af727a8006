"""The strong idempotence check: a 流水 ledger row written in the caller's own transaction.

A handler records the message in the ledger table inside the same database
transaction as its business change. The table's primary key is
(scene, biz_key), so a second delivery of the same message fails its insert:
`Ledger.record` raises `DuplicateMessage`, the caller lets it propagate out of
its transaction block, and the transaction rolls back. The business change
and the ledger row therefore commit together or not at all; a handler that
fails before commit leaves neither, and the redelivered message succeeds.

One `Ledger` serves every supported connection (see `ledger_conn`): with a
sync connection its methods return the result, with an asyncio connection
they return an awaitable (`await ledger.record(aconn, ...)`).

Schema: `create_schema(conn)` creates the table and its indexes (idempotent).
Without it, the first use creates them too, inside the caller's transaction
(SQLite: when an insert finds no table; PostgreSQL: once per connection or
engine, after a catalog check, under an advisory lock).
"""
from __future__ import annotations

import time
import weakref
from dataclasses import dataclass
from typing import Any, Protocol

from ferry.errors import DuplicateMessage, FerryError
from ferry.idempotence.keys import MAX_SCENE_CHARS, biz_key_of, validate_scene
from ferry.idempotence.ledger_conn import (
    LedgerUsageError,
    Target,
    detect,
    require_transaction,
    run_async,
    run_sync,
)
from ferry.idempotence.ledger_sql import POSTGRES, SQLITE, LedgerSQL, is_duplicate, is_missing_table
from ferry.idempotence.ledger_sql import valid_table_name as _valid_table_name
from ferry.idempotence.transactional import DEFAULT_MAX_IDLE, Connect, TransactionalLedger

DEFAULT_TABLE = "ferry_ledger"
BIZ_KEY_MAX_CHARS = 512


class MessageRef(Protocol):
    """What the ledger reads of a message: a `ferry.ConsumerRecord` has all of it."""

    @property
    def msg_id(self) -> str: ...
    @property
    def topic(self) -> str: ...
    @property
    def queue_id(self) -> int: ...
    @property
    def queue_offset(self) -> int: ...
    @property
    def key(self) -> str | None: ...


@dataclass(frozen=True)
class LedgerEntry:
    """One ledger row: which message was processed, for which business key, and when."""

    scene: str
    biz_key: str
    msg_id: str
    topic: str
    group: str
    queue_id: int
    queue_offset: int
    recorded_ms: int
    amount: int | None = None   # in the smallest unit (cents): exact sums everywhere

    def params(self) -> dict[str, Any]:
        return {"scene": self.scene, "biz_key": self.biz_key, "msg_id": self.msg_id,
                "topic": self.topic, "consumer_group": self.group, "queue_id": self.queue_id,
                "queue_offset": self.queue_offset, "recorded_ms": self.recorded_ms,
                "amount": self.amount}

    @classmethod
    def from_row(cls, row: tuple[Any, ...]) -> LedgerEntry:
        scene, biz_key, msg_id, topic, group, queue_id, offset, recorded_ms, amount = row
        return cls(str(scene), str(biz_key), str(msg_id), str(topic), str(group), int(queue_id),
                   int(offset), int(recorded_ms), None if amount is None else int(amount))


class Ledger:
    """The ledger table of one consumer group (or of several: `group` is per row).

    `table` is a plain SQL identifier (default `ferry_ledger`); `group` is the
    consumer group written into each row unless `record()` names another.
    """

    def __init__(self, *, table: str = DEFAULT_TABLE, group: str = "") -> None:
        if not _valid_table_name(table):
            raise LedgerUsageError(f"ledger: table name {table!r} is not a plain identifier "
                                   "([A-Za-z_][A-Za-z0-9_]*, at most 48 characters)")
        self.table = table
        self.group = group
        # Databases (psycopg connections, SQLAlchemy engines) where the table was seen.
        self._ready: weakref.WeakSet[Any] = weakref.WeakSet()
        self._sqls = {d: LedgerSQL(d, table) for d in (SQLITE, POSTGRES)}

    def _sql(self, target: Target) -> LedgerSQL:
        return self._sqls[target.dialect]

    # -- the entry a record() call writes ------------------------------------------

    def entry(self, *, scene: str, record: MessageRef, biz_key: str | None = None,
              group: str | None = None, amount: int | None = None,
              recorded_ms: int | None = None) -> LedgerEntry:
        """The row `record()` inserts for these arguments (validated)."""
        key = biz_key if biz_key is not None else biz_key_of(record)
        try:
            validate_scene(scene)   # the same scenes as the Redis claim's
        except FerryError as exc:
            raise LedgerUsageError(f"ledger: {exc} (at most {MAX_SCENE_CHARS})") from None
        if not key or len(key) > BIZ_KEY_MAX_CHARS:
            raise LedgerUsageError(f"ledger: biz_key must be 1..{BIZ_KEY_MAX_CHARS} characters")
        if amount is not None and not isinstance(amount, int):
            raise LedgerUsageError("ledger: amount is an int in the smallest unit (e.g. cents)")
        return LedgerEntry(scene, key, record.msg_id, record.topic,
                           self.group if group is None else group, record.queue_id,
                           record.queue_offset,
                           int(time.time() * 1000) if recorded_ms is None else recorded_ms,
                           amount)

    # -- public API: each returns the result (sync conn) or an awaitable (async conn) --

    def create_schema(self, conn: Any) -> Any:
        """Create the ledger table and its indexes if missing, in the caller's transaction
        (commit it). Idempotent: safe to run at every start."""
        target = detect(conn)
        if target.is_async:
            return self._create_schema_async(target, conn)
        for sql, params in self._schema_steps(target):
            run_sync(target, conn, sql, params)
        return None

    def record(self, conn: Any, *, scene: str, record: MessageRef, biz_key: str | None = None,
               group: str | None = None, amount: int | None = None) -> Any:
        """Insert this message's ledger row in the caller's open transaction.

        `biz_key` defaults to the message key, else the message id. Raises
        `DuplicateMessage` when (scene, biz_key) is already recorded: let it
        propagate so the caller's transaction rolls back. Returns the
        `LedgerEntry` written (awaitable for an asyncio connection).
        """
        target = detect(conn)
        entry = self.entry(scene=scene, record=record, biz_key=biz_key, group=group,
                           amount=amount)
        require_transaction(target, conn)
        if target.is_async:
            return self._record_async(target, conn, entry)
        sql = self._sql(target)
        if target.database is not None and target.database not in self._ready:
            if run_sync(target, conn, sql.table_exists(), {"table_name": self.table}):
                self._ready.add(target.database)
            else:
                self.create_schema(conn)
        try:
            run_sync(target, conn, sql.insert(), entry.params())
        except Exception as exc:
            if not (target.dialect == SQLITE and is_missing_table(exc, sql)):
                raise self._translate(exc, sql, entry) from exc
            # First use on SQLite: a failed statement leaves the transaction going.
            self.create_schema(conn)
            try:
                run_sync(target, conn, sql.insert(), entry.params())
            except Exception as again:
                raise self._translate(again, sql, entry) from again
        return entry

    def transactional(self, *, connect: Connect, scene: str | None = None,
                      max_idle: int = DEFAULT_MAX_IDLE) -> TransactionalLedger:
        """A check that opens the transaction itself, for `consumer.run(..., idempotence=)`:
        per message, the ledger row first, then `await handler(record, conn)`, then
        commit (see `transactional`). `connect()` makes a connection (or an awaitable of one).
        """
        return TransactionalLedger(self, connect=connect, scene=scene, max_idle=max_idle)

    def by_biz_key(self, conn: Any, *, scene: str, biz_key: str) -> Any:
        """The ledger row of (scene, biz_key), or None (awaitable for an asyncio connection)."""
        target = detect(conn)
        sql, params = self._sql(target).select_by_biz_key(), {"scene": scene, "biz_key": biz_key}
        if target.is_async:
            return self._lookup_async(target, conn, sql, params, one=True)
        rows = self._lookup_rows(target, conn, sql, params)
        return LedgerEntry.from_row(rows[0]) if rows else None

    def by_msg_id(self, conn: Any, msg_id: str) -> Any:
        """Every ledger row of a message id (one per scene it was recorded in)."""
        target = detect(conn)
        sql, params = self._sql(target).select_by_msg_id(), {"msg_id": msg_id}
        if target.is_async:
            return self._lookup_async(target, conn, sql, params, one=False)
        return [LedgerEntry.from_row(r) for r in self._lookup_rows(target, conn, sql, params)]

    # -- internals ----------------------------------------------------------------

    def _schema_steps(self, target: Target) -> list[tuple[str, dict[str, Any]]]:
        sql = self._sql(target)
        lock = sql.schema_lock()
        steps: list[tuple[str, dict[str, Any]]] = []
        if lock is not None:
            steps.append((lock, {"lock_name": f"ferry.ledger.{self.table}"}))
        steps.extend((stmt, {}) for stmt in sql.schema())
        return steps

    @staticmethod
    def _translate(exc: Exception, sql: LedgerSQL, entry: LedgerEntry) -> Exception:
        if is_duplicate(exc, sql):
            return DuplicateMessage(scene=entry.scene, biz_key=entry.biz_key)
        return exc

    def _lookup_rows(self, target: Target, conn: Any, sql: str,
                     params: dict[str, Any]) -> list[tuple[Any, ...]]:
        # A ledger never written to has no table yet: it holds nothing. PostgreSQL is
        # asked first (a failed statement would abort the caller's transaction);
        # SQLite says so in its error and keeps the transaction going.
        if target.database is not None and target.database not in self._ready:
            if not run_sync(target, conn, self._sql(target).table_exists(),
                            {"table_name": self.table}):
                return []
            self._ready.add(target.database)
        try:
            return run_sync(target, conn, sql, params)
        except Exception as exc:
            if target.dialect == SQLITE and is_missing_table(exc, self._sql(target)):
                return []
            raise

    async def _create_schema_async(self, target: Target, conn: Any) -> None:
        for sql, params in self._schema_steps(target):
            await run_async(target, conn, sql, params)

    async def _record_async(self, target: Target, conn: Any, entry: LedgerEntry) -> LedgerEntry:
        sql = self._sql(target)
        if target.database is not None and target.database not in self._ready:
            if await run_async(target, conn, sql.table_exists(), {"table_name": self.table}):
                self._ready.add(target.database)
            else:
                await self._create_schema_async(target, conn)
        try:
            await run_async(target, conn, sql.insert(), entry.params())
        except Exception as exc:
            if not (target.dialect == SQLITE and is_missing_table(exc, sql)):
                raise self._translate(exc, sql, entry) from exc
            await self._create_schema_async(target, conn)
            try:
                await run_async(target, conn, sql.insert(), entry.params())
            except Exception as again:
                raise self._translate(again, sql, entry) from again
        return entry

    async def _lookup_async(self, target: Target, conn: Any, sql: str, params: dict[str, Any],
                            *, one: bool) -> LedgerEntry | None | list[LedgerEntry]:
        rows: list[tuple[Any, ...]] = []
        exists = True
        if target.database is not None and target.database not in self._ready:
            exists = bool(await run_async(target, conn, self._sql(target).table_exists(),
                                          {"table_name": self.table}))
            if exists:
                self._ready.add(target.database)
        try:
            if exists:
                rows = await run_async(target, conn, sql, params)
        except Exception as exc:
            if not (target.dialect == SQLITE and is_missing_table(exc, self._sql(target))):
                raise
        entries = [LedgerEntry.from_row(r) for r in rows]
        if one:
            return entries[0] if entries else None
        return entries

