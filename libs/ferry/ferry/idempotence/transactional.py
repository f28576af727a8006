"""The ledger check that opens the transaction itself: `ledger.transactional(connect=...)`.

For each message it takes a connection (reused from a small pool; `connect()`
makes a new one), begins a transaction, inserts the ledger row FIRST, calls
`await handler(record, conn)` for the business change on that same
connection, and commits after the handler returns. Any exception rolls back
both and propagates (so `consumer.run` nacks the message); a duplicate fails
the ledger insert before the handler runs: rolled back, reported as
`Outcome.DUPLICATE`, acknowledged.

Inserting the ledger row first makes a duplicate cost one failed insert and
no business work, and on PostgreSQL it makes a racing second delivery wait on
the row lock of the first instead of doing its business work twice.
"""
from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any

from ferry.client.message import ConsumerRecord
from ferry.errors import DuplicateMessage, FerryError
from ferry.idempotence.keys import validate_scene
from ferry.idempotence.ledger_conn import AIOSQLITE, PSYCOPG, SQLITE3, Target, detect
from ferry.idempotence.ledger_sql import SQLITE
from ferry.idempotence.states import Outcome

if TYPE_CHECKING:
    from ferry.idempotence.ledger import Ledger

log = logging.getLogger("ferry.idempotence")

#: `handler(record, conn)`: the business change, on the transaction's connection.
TxHandler = Callable[[ConsumerRecord, Any], Awaitable[Any]]
#: Makes one connection: returns it, or an awaitable of it (aiosqlite, psycopg async).
Connect = Callable[[], Any]

DEFAULT_MAX_IDLE = 8      # connections kept open between messages (one per concurrent handler)
MAX_IDLE_LIMIT = 256


async def _maybe_await(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


@contextlib.asynccontextmanager
async def transaction(target: Target, conn: Any) -> AsyncIterator[None]:
    """One transaction on `conn`: committed when the block returns, rolled back when it raises."""
    if target.driver in (SQLITE3, AIOSQLITE):
        # sqlite3's implicit BEGIN comes only before DML; say it so the whole block is one.
        if not conn.in_transaction:
            await _maybe_await(conn.execute("BEGIN"))
        try:
            yield
        except BaseException:
            await _maybe_await(conn.rollback())
            raise
        await _maybe_await(conn.commit())
    elif target.driver == PSYCOPG and not target.is_async:
        with conn.transaction():
            yield
    elif target.driver == PSYCOPG:
        async with conn.transaction():
            yield
    elif target.is_async:   # SQLAlchemy AsyncConnection / AsyncSession
        async with conn.begin():
            yield
    else:                   # SQLAlchemy Connection / Session
        with conn.begin():
            yield


class TransactionalLedger:
    """`consumer.run(handle, idempotence=ledger.transactional(connect=...))`.

    `connect` makes a connection of a kind `Ledger` supports (sqlite3,
    aiosqlite, psycopg 3 sync/async, SQLAlchemy Connection/AsyncConnection/
    Session/AsyncSession); up to `max_idle` are kept for reuse. `scene`
    defaults to the consumer group's name. Use `async with` or `aclose()` to
    close the kept connections.
    """

    def __init__(self, ledger: Ledger, *, connect: Connect, scene: str | None = None,
                 max_idle: int = DEFAULT_MAX_IDLE) -> None:
        if not callable(connect):
            raise FerryError("transactional: connect must be a callable that makes a connection")
        if not isinstance(max_idle, int) or not 0 <= max_idle <= MAX_IDLE_LIMIT:
            raise FerryError(f"transactional: max_idle must be an int in 0..{MAX_IDLE_LIMIT}")
        self.ledger = ledger
        self.scene = None if scene is None else validate_scene(scene)
        self.max_idle = max_idle
        self._connect = connect
        self._idle: list[Any] = []
        # SQLite has one writer at a time, and a sync driver's lock wait would block the
        # event loop while the holder (another handler on this loop) cannot commit: such
        # transactions run one at a time. Async drivers on PostgreSQL run concurrently.
        self._one_at_a_time = asyncio.Lock()

    async def aclose(self) -> None:
        """Close the connections kept for reuse."""
        idle, self._idle = self._idle, []
        for conn in idle:
            await self._close(conn)

    async def __aenter__(self) -> TransactionalLedger:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def wrap(self, handler: TxHandler, *, scene: str | None = None,
             group: str | None = None) -> Callable[[ConsumerRecord], Awaitable[Outcome]]:
        """`handler(record, conn)` inside the ledger's transaction, as a `handler(record)`.

        `scene` defaults to this check's own; `group` (the rows' consumer
        group) to the Ledger's. `consumer.run` passes its group for both.
        """
        chosen = scene or self.scene
        if chosen is None:
            raise FerryError("transactional ledger: a scene is needed (scene=...)")
        validate_scene(chosen)

        async def in_transaction(record: ConsumerRecord) -> Outcome:
            return await self.run(record, handler, scene=chosen, group=group)
        return in_transaction

    async def run(self, record: ConsumerRecord, handler: TxHandler, *, scene: str,
                  group: str | None = None) -> Outcome:
        """Record `record` and run `handler(record, conn)` in one transaction.

        RAN when committed, DUPLICATE when (scene, business key) was recorded
        before (rolled back, the handler did not run). The handler's
        exception rolls back and propagates.
        """
        conn = await self._take()
        target = detect(conn)
        failed_in_handler: BaseException | None = None
        healthy = False
        try:
            async with self._serialised(target), transaction(target, conn):
                await _maybe_await(self.ledger.record(conn, scene=scene, record=record,
                                                      group=group or None))
                try:
                    await handler(record, conn)
                except BaseException as exc:
                    failed_in_handler = exc
                    raise
            healthy = True
            return Outcome.RAN
        except DuplicateMessage:
            healthy = True   # rolled back cleanly: the connection is fine
            log.debug("idempotence: %s (%s:%s) already recorded; skipped", record.msg_id,
                      scene, record.key or record.msg_id)
            return Outcome.DUPLICATE
        except Exception as exc:
            # The handler's own failure was rolled back; anything else (commit,
            # rollback, connection) may have left the connection unusable.
            healthy = exc is failed_in_handler
            raise
        finally:
            await self._give_back(conn, healthy)

    def _serialised(self, target: Target) -> contextlib.AbstractAsyncContextManager[Any]:
        if target.dialect == SQLITE or not target.is_async:
            return self._one_at_a_time
        return contextlib.nullcontext()

    async def _take(self) -> Any:
        if self._idle:
            return self._idle.pop()
        return await _maybe_await(self._connect())

    async def _give_back(self, conn: Any, healthy: bool) -> None:
        if healthy and len(self._idle) < self.max_idle:
            self._idle.append(conn)
        else:
            await self._close(conn)

    @staticmethod
    async def _close(conn: Any) -> None:
        try:
            await _maybe_await(conn.close())
        except Exception as exc:   # closing a broken connection may fail too: it is gone
            log.debug("idempotence: closing a ledger connection failed: %r", exc)
