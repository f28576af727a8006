"""The low-water mark: committed only past what was settled, with the right history id."""
from __future__ import annotations

from ferry_delay_scheduler.progress import LowWater


def test_the_mark_stops_at_the_first_pending_record() -> None:
    low = LowWater()
    mark = low.open("b", 0, 10, "E1")
    assert mark.low_water() == (10, "E1") and mark.taken == 10
    low.add(mark, [(10, 100), (11, 101), (12, 102)], 13, "E2")
    assert mark.taken == 13 and mark.hist == "E2"
    assert mark.low_water() == (10, "E1")  # nothing settled yet
    low.settle([101])  # delivered out of order: the mark cannot pass 10
    assert mark.low_water() == (10, "E1")
    low.settle([100])
    assert mark.low_water() == (12, "E2")
    low.settle([102])
    assert mark.low_water() == (13, "E2") and low.pinned == 0


def test_answers_with_nothing_to_take_move_the_mark() -> None:
    low = LowWater()
    mark = low.open("b", 1, 0, None)
    low.add(mark, [], 5, "E3")  # every record skipped (cancelled)
    assert mark.low_water() == (5, "E3")


def test_a_replaced_history_detaches_what_was_taken_past_the_parting_point() -> None:
    low = LowWater()
    mark = low.open("b", 2, 0, None)
    low.add(mark, [(0, 1), (1, 2)], 2, "L1")
    low.add(mark, [(2, 3), (3, 4)], 4, "L1")
    assert low.rewind(mark, 1, None) == 3  # offsets 1, 2, 3 are another log's now
    assert mark.taken == 1 and low.pinned == 1
    low.add(mark, [(1, 9)], 2, "L2")
    low.settle([1, 9])
    assert mark.low_water() == (2, "L2")


def test_old_pending_lists_what_pins_the_mark_oldest_first() -> None:
    low = LowWater()
    mark = low.open("b", 3, 0, None)
    low.add(mark, [(0, 10), (1, 11)], 2, "E1")
    low.settle([10])
    far_future = 2**62
    assert low.old_pending(mark, far_future, 10) == [11]
    assert low.old_pending(mark, 0, 10) == []  # nothing taken that long ago


def test_many_settled_batches_are_dropped_and_the_rest_still_settle() -> None:
    low = LowWater()
    mark = low.open("b", 4, 0, None)
    phy = 0
    for batch in range(300):
        taken = [(batch * 10 + i, phy + i * 100) for i in range(10)]
        phy += 1000
        low.add(mark, taken, batch * 10 + 10, f"E{batch}")
    assert low.pinned == 3000
    low.settle([p for p in range(100, 300_000, 100) if p % 1000])  # all but each batch's first
    assert low.pinned == 300 and mark.low_water() == (0, None)
    low.settle([b * 1000 for b in range(1, 300)])  # every batch but the first is whole now
    assert low.pinned == 1 and len(low._batches) < 100  # the settled batches went
    low.settle([0])
    assert low.pinned == 0 and mark.low_water() == (3000, "E299")


def test_a_rewind_past_a_settled_record_after_the_last_open_one() -> None:
    """Delivered out of order: the batch's last open record is not its last record. The
    rewind settles it, the batch frees its arrays, and the settled one after it is done."""
    low = LowWater()
    mark = low.open("b", 3, 0, None)
    low.add(mark, [(0, 10), (1, 11), (2, 12)], 3, "L1")
    low.settle([10, 12])  # only offset 1 is still open
    assert low.rewind(mark, 1, None) == 1  # offset 1 detached; 2 was settled already
    assert mark.taken == 1 and low.pinned == 0
    assert mark.low_water() == (1, "L1")
