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

On SQLite (sqlite3, aiosqlite) the messages that wait together share one
transaction (group commit): each runs inside a SAVEPOINT of its own, so a
failing or duplicate message rolls back only its own ledger row and business
change, and all are committed at once. SQLite has one writer at a time, so
this is where its throughput comes from. Every message of the batch learns
its outcome only after the commit (or all fail with the commit's error), so
a message is acknowledged only once its rows are durable.
"""
from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from ferry.client.core.message import ConsumerRecord
from ferry.errors import DuplicateMessage, FerryError
from ferry.idempotence.keys import validate_scene
from ferry.idempotence.ledger_conn import AIOSQLITE, PSYCOPG, SQLITE3, Target, detect
from ferry.idempotence.ledger_sql import SQLITE
from ferry.idempotence.states import Outcome

log = logging.getLogger("ferry.idempotence")

#: `handler(record, conn)`: the business change, on the transaction's connection.
TxHandler = Callable[[ConsumerRecord, Any], Awaitable[Any]]
#: Makes one connection: returns it, or an awaitable of it (aiosqlite, psycopg async).
Connect = Callable[[], Any]

DEFAULT_MAX_IDLE = 8      # connections kept open between messages (one per concurrent handler)
MAX_IDLE_LIMIT = 256
#: Messages per shared SQLite transaction at most: it holds the database's write lock.
MAX_GROUP_COMMIT = 128
_SAVEPOINT = "ferry_ledger_msg"


@dataclass(slots=True)
class _Waiting:
    """One message waiting for a shared (group-commit) transaction."""

    record: ConsumerRecord
    handler: TxHandler
    scene: str
    group: str | None
    future: asyncio.Future[Outcome] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future())


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


class RecordingLedger(Protocol):
    """What a TransactionalLedger uses of its `ledger.Ledger` (which imports this module)."""

    group: str

    def record(self, conn: Any, *, scene: str, record: ConsumerRecord,
               group: str | None = None) -> Any: ...


class TransactionalLedger:
    """`consumer.run(handle, idempotence=ledger.transactional(connect=...))`.

    `connect` makes a connection of a kind `Ledger` supports (sqlite3,
    aiosqlite, psycopg 3 sync/async, SQLAlchemy Connection/AsyncConnection/
    Session/AsyncSession); up to `max_idle` are kept for reuse. `scene`
    defaults to the consumer group's name. Use `async with` or `aclose()` to
    close the kept connections.
    """

    def __init__(self, ledger: RecordingLedger, *, connect: Connect, scene: str | None = None,
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
        self._target: Target | None = None   # the kind of connection connect() makes
        self._waiting: list[_Waiting] = []   # messages waiting for a group commit
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
        if self._target is None:   # learn the kind of connection once
            conn = await self._take()
            self._target = detect(conn)
            await self._give_back(conn, True)
        if self._target.driver in (SQLITE3, AIOSQLITE):
            return await self._group_commit(_Waiting(record, handler, scene, group))
        return await self._run_alone(record, handler, scene, group)

    async def _run_alone(self, record: ConsumerRecord, handler: TxHandler, scene: str,
                         group: str | None) -> Outcome:
        """One message in a transaction of its own."""
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
            self._log_duplicate(record, scene)
            return Outcome.DUPLICATE
        except Exception as exc:
            # The handler's own failure was rolled back; anything else (commit,
            # rollback, connection) may have left the connection unusable.
            healthy = exc is failed_in_handler
            raise
        finally:
            await self._give_back(conn, healthy)

    async def _group_commit(self, waiting: _Waiting) -> Outcome:
        """Wait for a shared transaction to run this message (or lead one), then its outcome."""
        self._waiting.append(waiting)
        await asyncio.sleep(0)   # let the handlers started in this turn join the batch
        while not waiting.future.done():
            async with self._one_at_a_time:
                if not waiting.future.done():
                    batch = self._waiting[:MAX_GROUP_COMMIT]
                    del self._waiting[:MAX_GROUP_COMMIT]
                    await self._run_batch([w for w in batch if not w.future.done()])
        return waiting.future.result()

    async def _run_batch(self, batch: list[_Waiting]) -> None:
        """Each message in a SAVEPOINT of one transaction; outcomes set after the commit."""
        conn = await self._take()
        target = detect(conn)
        outcomes: list[Outcome | Exception] = []
        healthy = False
        try:
            async with transaction(target, conn):
                for waiting in batch:
                    outcomes.append(await self._in_savepoint(conn, waiting))
            healthy = True
        except Exception as exc:   # the commit (or a savepoint) failed: none of them is done
            for waiting in batch:
                if not waiting.future.done():
                    waiting.future.set_exception(exc)
            return
        except BaseException:      # cancelled: rolled back; the others are not done either
            for waiting in batch:
                waiting.future.cancel()
            raise
        finally:
            await self._give_back(conn, healthy)
        for waiting, outcome in zip(batch, outcomes, strict=True):
            if waiting.future.done():
                continue
            if isinstance(outcome, Exception):
                waiting.future.set_exception(outcome)
            else:
                waiting.future.set_result(outcome)

    async def _in_savepoint(self, conn: Any, waiting: _Waiting) -> Outcome | Exception:
        """One message of a shared transaction: its rows stay, or roll back to the savepoint."""
        await _maybe_await(conn.execute(f"SAVEPOINT {_SAVEPOINT}"))
        try:
            await _maybe_await(self.ledger.record(conn, scene=waiting.scene,
                                                  record=waiting.record,
                                                  group=waiting.group or None))
            await waiting.handler(waiting.record, conn)
        except Exception as exc:
            await _maybe_await(conn.execute(f"ROLLBACK TO {_SAVEPOINT}"))
            await _maybe_await(conn.execute(f"RELEASE {_SAVEPOINT}"))
            if isinstance(exc, DuplicateMessage):
                self._log_duplicate(waiting.record, waiting.scene)
                return Outcome.DUPLICATE
            return exc
        await _maybe_await(conn.execute(f"RELEASE {_SAVEPOINT}"))
        return Outcome.RAN

    @staticmethod
    def _log_duplicate(record: ConsumerRecord, scene: str) -> None:
        log.debug("idempotence: %s (%s:%s) already recorded; skipped", record.msg_id, scene,
                  record.key or record.msg_id)

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
