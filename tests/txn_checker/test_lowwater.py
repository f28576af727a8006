"""The low-water marks a new leader rebuilds from (ferry_txn_checker.scans), without a broker."""
from __future__ import annotations

import random
from pathlib import Path

from ferry_txn_checker import checkpoint
from ferry_txn_checker.scans import MAX_MARKS, OpMarks, checks_by_age
from ferry_txn_checker.state import Book

from tests.txn_checker.records import half, op

T0 = 1_700_000_000_000


def book(**kw: int) -> Book:
    args = {"default_immunity_ms": 1000, "max_open": 100_000, "max_discarded": 10,
            "max_recent": 10, "check_interval_ms": 2000, "max_checks": 5} | kw
    return Book(**args)


def test_op_marks_answer_the_first_op_of_a_half_at_or_above_the_mark() -> None:
    marks = OpMarks()
    # op offset -> half offset, in op order: halves end out of order.
    for o, h in enumerate([5, 2, 7, 3, 9, 8]):
        marks.add(h, o, f"E{o}")
    assert marks.low(0) == (0, "E0")   # op 0 ends half 5
    assert marks.low(6) == (2, "E2")   # ops 0, 1 end halves below 6; op 2 ends half 7
    assert marks.low(7) == (2, "E2")
    assert marks.low(8) == (4, "E4")   # op 4 ends half 9 (op 5 half 8, later)
    assert marks.low(9) == (4, "E4")
    assert marks.low(10) is None       # no op of a half >= 10 read yet


def test_op_marks_stay_bounded_and_only_get_lower() -> None:
    rng = random.Random(7)
    marks = OpMarks()
    # Halves end about in order (the common case: the marks would grow with every op).
    pairs = [(2 * o + rng.randint(-20, 20), o) for o in range(50_000)]
    for h, o in pairs:
        marks.add(h, o, None)
    assert len(marks) <= MAX_MARKS
    for low in (0, 10, 5000, 42_000, 99_000):
        exact = min((o for h, o in pairs if h >= low), default=None)
        got = marks.low(low)
        assert (got is None) == (exact is None)
        if got is not None and exact is not None:
            assert got[0] <= exact  # never past an op a new leader needs


def test_checks_by_age_counts_the_slots_passed_less_the_latest() -> None:
    assert checks_by_age(T0, T0 - 1, 2000, 5) == 0
    assert checks_by_age(T0, T0, 2000, 5) == 0       # the first check: sent again now
    assert checks_by_age(T0, T0 + 4500, 2000, 5) == 2  # slots 0, 1, 2 passed
    assert checks_by_age(T0, T0 + 60_000, 2000, 5) == 5  # its discard is due


def test_low_water_marks_never_pass_an_open_half_or_an_op_of_one() -> None:
    b = book()
    halves = [half(i, T0 + i) for i in range(6)]
    b.add_halves("a", halves[:3], 3, "E1", None)
    b.add_halves("a", halves[3:], 6, "E2", "E1")
    # Halves 0, 2, 4, 5 end (op 0..3); 1 and 3 stay open.
    ops = [op(i, halves[h]) for i, h in enumerate([4, 0, 2, 5])]
    b.add_ops("a", ops, 4, "E2", None)
    scan = b.broker("a")
    (half_low, half_hist), (op_low, op_hist) = scan.low_water()
    assert (half_low, half_hist) == (1, "E1")  # the open half 1; half 0 was of E1
    assert (op_low, op_hist) == (0, None)      # op 0 ends half 4 >= 1
    # Half 1 ends: the lowest open is 3 (of E2, the record before it of E1).
    b.add_ops("a", [op(4, halves[1])], 5, "E2", "E2")
    (half_low, half_hist), (op_low, _) = scan.low_water()
    assert (half_low, half_hist, op_low) == (3, "E1", 0)
    # Everything ends: the marks are the scan positions.
    b.add_ops("a", [op(5, halves[3])], 6, "E2", "E2")
    assert scan.low_water() == ((6, None), (6, None))  # the cursor keeps the hists


def test_a_book_rebuilt_from_the_marks_matches_the_one_it_replaces(tmp_path: Path) -> None:
    """A new leader reads both queues again from the marks: the same open set, nothing
    that ended is open again, ops not counted as resolving anything twice."""
    rng = random.Random(3)
    b = book()
    halves = [half(i, T0 + i) for i in range(200)]
    b.add_halves("a", halves, 200, "E1", None)
    ended = rng.sample(range(200), 150)
    ops = [op(i, halves[h]) for i, h in enumerate(ended)]
    b.add_ops("a", ops, len(ops), "E1", None)
    (half_low, _), (op_low, _) = b.broker("a").low_water()

    again = book()
    again.forget_positions(T0 + 10_000)
    scan = again.broker("a", settled=False)
    scan.half_next, scan.op_next, scan.settled = half_low, op_low, True
    # The op scan may run ahead of the half scan: ops first, then halves.
    again.add_ops("a", ops[op_low:], len(ops), "E1", None)
    again.add_halves("a", halves[half_low:], 200, "E1", None)
    assert set(again.broker("a").open) == set(b.broker("a").open)
    assert again.open_count == b.open_count == 50
    checkpoint.save(tmp_path, checkpoint.encode(again.snapshot(), 7))
    doc = checkpoint.load(tmp_path) or {}
    assert doc["epoch"] == 7 and doc["brokers"]["a"]["half_next"] == 200


def test_halves_read_again_by_a_new_leader_count_the_checks_their_age_allows() -> None:
    b = book()
    b.forget_positions(T0 + 5000)
    old, new = half(0, T0), half(1, T0 + 6000)  # stored before / after the takeover
    b.add_halves("a", [old, new], 2)
    scan = b.broker("a")
    # old: first due T0 + 1000; slots at +1000, +3000, +5000 passed -> 2 counted, due now.
    assert scan.open[old.msg_id_hex].checks == 2
    assert scan.open[new.msg_id_hex].checks == 0
    assert b.open_count == 2


def test_marks_of_a_replaced_op_history_are_dropped() -> None:
    marks = OpMarks()
    for o, h in enumerate([1, 4, 6, 9]):
        marks.add(h, o + 10, "E1")
    marks.cut(12)  # the %OP% history parted at 12: ops 12, 13 were of the old one
    assert marks.rows() == [[1, 10, "E1"], [4, 11, "E1"]]
    marks.add(8, 12, "E2")  # the new history's op at 12
    assert marks.low(5) == (12, "E2")
