"""The checker's bookkeeping (ferry_txn_checker.state) and its checkpoint, without a broker."""
from __future__ import annotations

from pathlib import Path

import pytest
from ferry_txn_checker import checkpoint
from ferry_txn_checker.state import Book

from tests.txn_checker.records import half, op

T0 = 1_700_000_000_000


def book(**kw: int) -> Book:
    args = {"default_immunity_ms": 6000, "max_open": 100, "max_discarded": 10,
            "max_recent": 10} | kw
    return Book(**args)


def synced(b: Book, at_ms: int, broker: str = "a") -> None:
    b.broker(broker).op_synced_ms = at_ms


def test_a_half_is_due_after_its_immunity_and_once_its_ops_are_read() -> None:
    b = book()
    h1, h2 = half(0, T0), half(1, T0, immunity_ms=1000)
    assert b.add_halves("a", [h1, h2], 2) == 2
    assert b.open_count == 2
    synced(b, T0 + 10_000)
    assert [t.msg_id for t in b.take_due(T0 + 999, 10, 200)] == []
    assert [t.msg_id for t in b.take_due(T0 + 1000, 10, 200)] == [h2.msg_id_hex]
    assert [t.msg_id for t in b.take_due(T0 + 6000, 10, 200)] == [h1.msg_id_hex]
    assert b.take_due(T0 + 7000, 10, 200) == []  # both in flight


def test_a_half_is_not_handed_out_while_its_op_scan_is_behind() -> None:
    b = book(default_immunity_ms=1000)
    b.add_halves("a", [half(0, T0)], 1)
    synced(b, T0 + 500)  # ops stored after T0 + 500 are not read yet
    assert b.take_due(T0 + 2000, 10, 200) == []
    synced(b, T0 + 2000)
    assert len(b.take_due(T0 + 2200, 10, 200)) == 1


def test_an_op_resolves_its_half_and_is_counted_by_who_ended_it() -> None:
    b = book()
    h1, h2, h3 = half(0, T0), half(1, T0), half(2, T0)
    b.add_halves("a", [h1, h2, h3], 3)
    b.add_ops("a", [op(0, h1, "commit", "check"), op(1, h2, "rollback", "producer"),
                    op(2, h3, "rollback", "check")], 3)
    assert b.open_count == 0
    c = b.counters
    assert (c["committed_by_check"], c["rolled_back_by_check"], c["rolled_back_by_producer"]
            ) == (1, 1, 1)
    synced(b, T0 + 100_000)
    assert b.take_due(T0 + 100_000, 10, 200) == []
    assert b.find(h1.msg_id_hex)["state"] == "committed"


def test_an_op_read_before_its_half_keeps_the_half_from_opening() -> None:
    b = book()
    h = half(0, T0)
    b.add_ops("a", [op(0, h, "commit")], 1)
    assert len(b.broker("a").early_ops) == 1
    b.add_halves("a", [h], 1)
    assert b.open_count == 0 and not b.broker("a").early_ops
    assert b.find(h.msg_id_hex)["state"] == "committed"


def test_checks_follow_the_interval_and_count() -> None:
    b = book(default_immunity_ms=1000)
    b.add_halves("a", [half(0, T0)], 1)
    synced(b, T0 + 1_000_000)
    (txn,) = b.take_due(T0 + 1000, 10, 200)
    b.checked(txn, T0 + 1000, 60_000, forwarded=True)
    assert b.take_due(T0 + 60_999, 10, 200) == []
    (again,) = b.take_due(T0 + 61_000, 10, 200)
    assert again is txn and txn.checks == 1
    b.checked(txn, T0 + 61_000, 60_000, forwarded=False)
    assert txn.checks == 2 and b.counters["checked"] == 2
    assert b.counters["checks_without_producer"] == 1


def test_max_open_stops_the_half_scan_where_it_stood() -> None:
    b = book(max_open=2)
    halves = [half(i, T0) for i in range(4)]
    assert b.add_halves("a", halves, 4) == 2  # the next pull starts at offset 2
    assert b.open_count == 2 and b.broker("a").half_next == 2
    b.add_ops("a", [op(0, halves[0])], 1)
    assert b.add_halves("a", halves[2:], 4) == 3
    assert b.open_count == 2


def test_a_discard_is_listed_once_and_counted_once() -> None:
    b = book(default_immunity_ms=0)
    h = half(0, T0, group="orders-tx")
    b.add_halves("a", [h], 1)
    synced(b, T0)
    (txn,) = b.take_due(T0, 10, 200)
    b.discard(txn, T0 + 5)
    b.add_ops("a", [op(0, h, "rollback", "discarded")], 1)
    assert b.counters["discarded"] == 1 and b.open_count == 0
    (entry,) = b.list_discarded(10)
    assert entry["msg_id"] == h.msg_id_hex and entry["group"] == "orders-tx"
    assert b.find(h.msg_id_hex)["state"] == "discarded"


def test_the_discarded_list_is_bounded() -> None:
    b = book(max_discarded=3)
    halves = [half(i, T0) for i in range(5)]
    b.add_halves("a", halves, 5)
    b.add_ops("a", [op(i, h, "rollback", "discarded") for i, h in enumerate(halves)], 5)
    assert [d["msg_id"] for d in b.list_discarded(10)] == [h.msg_id_hex for h in halves[:1:-1]]
    assert b.counters["discarded"] == 5


def test_snapshot_restore_resumes_without_counting_twice(tmp_path: Path) -> None:
    b = book(default_immunity_ms=1000)
    halves = [half(i, T0) for i in range(3)]
    b.add_halves("a", halves, 3)
    b.add_ops("a", [op(0, halves[0], "commit", "check")], 1)
    synced(b, T0 + 10_000)
    (txn,) = b.take_due(T0 + 1000, 1, 200)
    b.checked(txn, T0 + 1000, 5000, forwarded=True)
    checkpoint.save(tmp_path, checkpoint.encode(b.snapshot()))

    again = book(default_immunity_ms=1000)
    again.restore(checkpoint.load(tmp_path) or {})
    assert again.open_count == 2
    assert again.broker("a").half_next == 3 and again.broker("a").op_next == 1
    assert again.find(txn.msg_id)["checks"] == 1
    # Records the crashed instance had pulled after the snapshot come again: once each.
    again.add_halves("a", halves, 3)
    again.add_ops("a", [op(0, halves[0], "commit", "check"), op(1, halves[1])], 2)
    assert again.open_count == 1
    assert again.counters["committed_by_check"] == 1
    assert again.counters["committed_by_producer"] == 1


def test_checkpoint_refuses_another_version(tmp_path: Path) -> None:
    assert checkpoint.load(tmp_path) is None
    (tmp_path / checkpoint.CHECKPOINT_FILE).write_text('{"version": 99}')
    with pytest.raises(ValueError, match="version 99"):
        checkpoint.load(tmp_path)
    (tmp_path / checkpoint.CHECKPOINT_FILE).write_text("{torn")
    with pytest.raises(ValueError, match="not valid JSON"):
        checkpoint.load(tmp_path)
