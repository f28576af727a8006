"""The ledger (strong check) on sync connections: sqlite3, psycopg and SQLAlchemy on
SQLite and on a real throwaway PostgreSQL.

Each scenario is what a consumer's handler does: a business write and the
ledger row in one transaction of the caller's own.
"""
from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
from ferry.idempotence import DuplicateMessage, Ledger, LedgerEntry, LedgerUsageError

from tests.idempotence.backends import SYNC_BACKENDS, SyncBackend, make_sync, pg_conninfo
from tests.support.procs import Postgres

pytestmark = pytest.mark.integration


@dataclass(frozen=True)
class Msg:
    """A consumed message as the ledger reads it (a ferry.ConsumerRecord has these)."""

    msg_id: str
    topic: str = "orders"
    queue_id: int = 1
    queue_offset: int = 7
    key: str | None = None


@pytest.fixture(params=SYNC_BACKENDS)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SyncBackend]:
    server, database = None, ""
    if "sqlite" not in request.param:
        server = request.getfixturevalue("postgres")
        database = request.getfixturevalue("pg_database")
    b = make_sync(request.param, tmp_path, server, database)
    yield b
    b.close()


def handle(backend: SyncBackend, ledger: Ledger, msg: Msg, *, fail: bool = False) -> None:
    """A handler: the business row, the ledger row, then commit (or fail before it)."""
    with backend.connect() as conn, backend.transaction(conn):
        backend.execute(conn, "INSERT INTO orders (order_id, amount) VALUES (:o, :a)",
                        {"o": msg.key or msg.msg_id, "a": 250})
        ledger.record(conn, scene="billing", record=msg, amount=250)
        if fail:
            raise RuntimeError("handler failed after its business write")


def counts(backend: SyncBackend, ledger: Ledger) -> tuple[int, int]:
    with backend.connect() as conn, backend.transaction(conn):
        orders = backend.execute(conn, "SELECT COUNT(*) FROM orders")[0][0]
        rows = backend.execute(conn, f"SELECT COUNT(*) FROM {ledger.table}")[0][0]
    return int(orders), int(rows)


def test_first_record_commits_with_the_business_row(backend: SyncBackend) -> None:
    ledger = Ledger(group="billing-group")
    msg = Msg("AB" * 16, key="order-1")
    handle(backend, ledger, msg)
    assert counts(backend, ledger) == (1, 1)
    with backend.connect() as conn, backend.transaction(conn):
        entry = ledger.by_biz_key(conn, scene="billing", biz_key="order-1")
        assert isinstance(entry, LedgerEntry)
        assert (entry.msg_id, entry.topic, entry.group, entry.queue_id, entry.queue_offset,
                entry.amount) == (msg.msg_id, "orders", "billing-group", 1, 7, 250)
        assert entry.recorded_ms > 0
        assert ledger.by_msg_id(conn, msg.msg_id) == [entry]


def test_duplicate_raises_and_the_rollback_keeps_one_of_each(backend: SyncBackend) -> None:
    ledger = Ledger()
    msg = Msg("CD" * 16, key="order-2")
    handle(backend, ledger, msg)
    with pytest.raises(DuplicateMessage) as info:
        handle(backend, ledger, Msg("EF" * 16, key="order-2"))  # a redelivery, new id
    assert info.value.code == 25 and not info.value.retriable
    assert "scene=billing, biz_key=order-2" in str(info.value)
    assert counts(backend, ledger) == (1, 1)


def test_failure_before_commit_leaves_nothing_and_the_retry_succeeds(
        backend: SyncBackend) -> None:
    ledger = Ledger()
    msg = Msg("01" * 16)   # no key: the message id is the business key
    with backend.connect() as conn, backend.transaction(conn):
        ledger.create_schema(conn)
    with pytest.raises(RuntimeError):
        handle(backend, ledger, msg, fail=True)
    assert counts(backend, ledger) == (0, 0)
    with backend.connect() as conn, backend.transaction(conn):
        assert ledger.by_biz_key(conn, scene="billing", biz_key=msg.msg_id) is None
    handle(backend, ledger, msg)
    assert counts(backend, ledger) == (1, 1)


def test_concurrent_duplicates_exactly_one_wins(backend: SyncBackend) -> None:
    ledger = Ledger()
    with backend.connect() as conn, backend.transaction(conn):
        ledger.create_schema(conn)
    barrier = threading.Barrier(2)
    outcomes: list[str] = []

    def racer(msg_id: str) -> None:
        with backend.connect() as conn:
            barrier.wait()
            try:
                with backend.transaction(conn):
                    backend.execute(conn, "INSERT INTO orders (order_id, amount) "
                                          "VALUES (:o, 1)", {"o": "order-race"})
                    ledger.record(conn, scene="billing", record=Msg(msg_id, key="order-race"))
            except DuplicateMessage:
                outcomes.append("duplicate")
            else:
                outcomes.append("recorded")

    threads = [threading.Thread(target=racer, args=(c * 32,)) for c in "12"]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert sorted(outcomes) == ["duplicate", "recorded"]
    assert counts(backend, ledger) == (1, 1)


def test_lookups_by_biz_key_and_message_id(backend: SyncBackend) -> None:
    ledger = Ledger(table="ledger_lookups")
    msg = Msg("9A" * 16, key="k-1", queue_offset=42)
    with backend.connect() as conn, backend.transaction(conn):
        assert ledger.by_msg_id(conn, msg.msg_id) == []   # no table yet: nothing recorded
        assert ledger.by_biz_key(conn, scene="billing", biz_key="k-1") is None
    with backend.connect() as conn, backend.transaction(conn):
        ledger.record(conn, scene="billing", record=msg)
        ledger.record(conn, scene="points", record=msg, biz_key="user-7:k-1", group="points")
    with backend.connect() as conn, backend.transaction(conn):
        found = ledger.by_msg_id(conn, msg.msg_id)
        assert [(e.scene, e.biz_key, e.group) for e in found] == [
            ("billing", "k-1", ""), ("points", "user-7:k-1", "points")]
        assert all(e.queue_offset == 42 and e.amount is None for e in found)
        assert ledger.by_biz_key(conn, scene="points", biz_key="k-1") is None
        assert ledger.by_msg_id(conn, "00" * 16) == []


def test_create_schema_is_idempotent(backend: SyncBackend) -> None:
    ledger = Ledger()
    for _ in range(2):
        with backend.connect() as conn, backend.transaction(conn):
            ledger.create_schema(conn)
    handle(backend, ledger, Msg("77" * 16))
    assert counts(backend, ledger) == (1, 1)


def test_psycopg_autocommit_outside_a_transaction_is_refused(
        postgres: Postgres, pg_database: str) -> None:
    with psycopg.connect(pg_conninfo(postgres, pg_database), autocommit=True) as conn:
        with pytest.raises(LedgerUsageError, match="autocommit"):
            Ledger().record(conn, scene="billing", record=Msg("55" * 16))
        with conn.transaction():   # an explicit transaction block is fine
            Ledger().record(conn, scene="billing", record=Msg("55" * 16))
        assert Ledger().by_biz_key(conn, scene="billing", biz_key="55" * 16) is not None
