"""The ledger's rules that need no server: keys, validation, refusals, the error it raises."""
from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest
from ferry.client.core.message import ConsumerRecord
from ferry.codec.record import MessageIn, decode_record, encode_record
from ferry.errors import ERRORS_BY_CODE, DuplicateMessage, error_for_code
from ferry.idempotence import Ledger, LedgerUsageError, biz_key_of
from ferry.idempotence.ledger_sql import SQLITE, LedgerSQL, is_duplicate, to_pyformat


def consumer_record(keys: str = "") -> ConsumerRecord:
    msg = MessageIn("orders", 2, b"{}", keys=keys, msg_id=os.urandom(16))
    stored = decode_record(encode_record(msg, queue_offset=41, phy_offset=0, store_ts_ms=5))
    return ConsumerRecord.from_stored(stored, "broker-a")


def test_business_key_is_the_message_key_else_the_message_id() -> None:
    keyed, plain = consumer_record("order-9 cust-1"), consumer_record()
    assert biz_key_of(keyed) == "order-9"
    assert biz_key_of(plain) == plain.msg_id


def test_a_consumer_record_is_recorded_with_its_position(tmp_path: Path) -> None:
    rec = consumer_record("order-9")
    conn = sqlite3.connect(tmp_path / "app.db")
    ledger = Ledger(group="billing")
    with conn:
        entry = ledger.record(conn, scene="pay", record=rec, amount=1999)
    assert (entry.biz_key, entry.msg_id, entry.topic, entry.queue_id, entry.queue_offset,
            entry.group, entry.amount) == ("order-9", rec.msg_id, "orders", 2, 41, "billing", 1999)
    assert ledger.by_biz_key(conn, scene="pay", biz_key="order-9") == entry
    conn.close()


def test_duplicate_message_is_wire_code_25_and_not_retriable() -> None:
    assert ERRORS_BY_CODE[25] is DuplicateMessage
    err = error_for_code(25, "already recorded: scene=pay, biz_key=o-1")
    assert isinstance(err, DuplicateMessage) and not err.retriable
    assert str(DuplicateMessage(scene="pay", biz_key="o-1")) == \
        "already recorded: scene=pay, biz_key=o-1"


def test_autocommit_connection_outside_a_transaction_is_refused(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "app.db", isolation_level=None)
    with pytest.raises(LedgerUsageError, match="autocommit"):
        Ledger().record(conn, scene="pay", record=consumer_record())
    conn.execute("BEGIN")   # an explicit transaction is fine
    Ledger().record(conn, scene="pay", record=consumer_record())
    conn.execute("COMMIT")
    conn.close()


def test_bad_arguments_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(LedgerUsageError, match="table name"):
        Ledger(table="ledger; DROP TABLE orders")
    with pytest.raises(LedgerUsageError, match="unsupported connection"):
        Ledger().record(object(), scene="pay", record=consumer_record())
    conn = sqlite3.connect(tmp_path / "app.db")
    with pytest.raises(LedgerUsageError, match="scene"):
        Ledger().record(conn, scene="", record=consumer_record())
    with pytest.raises(LedgerUsageError, match="biz_key"):
        Ledger().record(conn, scene="pay", record=consumer_record(), biz_key="x" * 513)
    conn.close()


def test_only_the_ledgers_own_unique_violation_is_a_duplicate(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "app.db")
    conn.execute("CREATE TABLE orders (order_id TEXT PRIMARY KEY)")
    conn.execute("INSERT INTO orders VALUES ('o-1')")
    with pytest.raises(sqlite3.IntegrityError) as info:
        conn.execute("INSERT INTO orders VALUES ('o-1')")
    assert not is_duplicate(info.value, LedgerSQL(SQLITE, "ferry_ledger"))
    conn.close()


def test_named_parameters_render_for_psycopg() -> None:
    assert to_pyformat("WHERE a = :scene AND b = :biz_key") == \
        "WHERE a = %(scene)s AND b = %(biz_key)s"
