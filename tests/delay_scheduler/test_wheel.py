"""The timing wheel: near window in memory, later buckets on disk, never early, journals."""
from __future__ import annotations

import os
from pathlib import Path

from ferry_delay_scheduler.wheel import CLOSE_GRACE_MS, TimingWheel
from ferry_delay_scheduler.wheel_files import EntryState

MIN = 60_000
T0 = 1_000 * MIN  # a round "now" (bucket 1000)


def _wheel(tmp_path: Path, closed_below: int = T0 // MIN) -> TimingWheel:
    w = TimingWheel(tmp_path / "wheel", bucket_ms=MIN, window_ms=MIN)
    w.open(closed_below)
    return w


def test_far_entries_stay_on_disk_until_the_window_reaches_them(tmp_path: Path) -> None:
    w = _wheel(tmp_path)
    w.add([(T0 + 10 * MIN + 5, T0, 100), (T0 + 30_000, T0, 200)])
    w.advance(T0)
    assert w.loaded == 1  # only the one due within the window
    w.flush()
    assert sorted(os.listdir(w.dir)) == ["000000001000.bkt", "000000001010.bkt"]
    w.advance(T0 + 9 * MIN)
    assert w.loaded == 2
    assert w.pending == 2


def test_never_early(tmp_path: Path) -> None:
    w = _wheel(tmp_path)
    due = T0 + 1234
    w.add([(due, T0, 1)])
    w.advance(T0)
    assert w.pop_due(due - 1, 100) == []
    got = w.pop_due(due, 100)
    assert [(d.due_ms, d.phy_offset) for d in got] == [(due, 1)]


def test_pop_is_in_due_order_and_bounded(tmp_path: Path) -> None:
    w = _wheel(tmp_path)
    w.add([(T0 + 30, T0, 3), (T0 + 10, T0, 1), (T0 + 20, T0, 2)])
    w.advance(T0)
    first = w.pop_due(T0 + 100, 2)
    assert [d.phy_offset for d in first] == [1, 2]
    assert [d.phy_offset for d in w.pop_due(T0 + 100, 2)] == [3]


def test_late_arrivals_are_due_at_once_in_an_open_bucket(tmp_path: Path) -> None:
    w = _wheel(tmp_path)
    w.advance(T0)
    w.add([(T0 - 5 * MIN, T0, 9)])  # due five minutes ago (the scheduler was down)
    assert [d.phy_offset for d in w.pop_due(T0, 10)] == [9]


def test_delivered_entries_are_not_loaded_again(tmp_path: Path) -> None:
    w = _wheel(tmp_path)
    w.add([(T0 + 10, T0, 1), (T0 + 20, T0, 2)])
    w.advance(T0)
    got = w.pop_due(T0 + 10, 10)
    w.mark_sending(got, T0 + 10)
    assert w.mark_delivered(got, T0 + 11) == 0
    w.sync()
    again = _wheel(tmp_path)  # a restart
    again.advance(T0)
    assert [d.phy_offset for d in again.pop_due(T0 + 100, 10)] == [2]


def test_sent_but_unacknowledged_entries_come_back_as_counted_duplicates(tmp_path: Path) -> None:
    w = _wheel(tmp_path)
    w.add([(T0 + 10, T0, 1)])
    w.advance(T0)
    got = w.pop_due(T0 + 10, 10)
    w.mark_sending(got, T0 + 10)
    w.sync()  # then the process dies before the broker's answer
    again = _wheel(tmp_path)
    again.advance(T0)
    redo = again.pop_due(T0 + 100, 10)
    assert [d.phy_offset for d in redo] == [1]
    assert again.mark_delivered(redo, T0 + 200) == 1


def test_duplicate_bucket_entries_load_once(tmp_path: Path) -> None:
    w = _wheel(tmp_path)
    w.add([(T0 + 10, T0, 1)])
    w.add([(T0 + 10, T0, 1)])  # recovery re-derived an entry that was already written
    w.sync()
    again = _wheel(tmp_path)
    again.advance(T0)
    assert [d.phy_offset for d in again.pop_due(T0 + 100, 10)] == [1]


def test_cancel_pending_then_delivered(tmp_path: Path) -> None:
    w = _wheel(tmp_path)
    w.add([(T0 + 10, T0, 1), (T0 + 5 * MIN, T0, 2), (T0 + 20, T0, 3)])
    w.advance(T0)
    assert w.cancel(T0 + 10, T0, 1, T0).state == EntryState.CANCELLED  # loaded
    assert w.cancel(T0 + 5 * MIN, T0, 2, T0).state == EntryState.CANCELLED  # still on disk
    got = w.pop_due(T0 + 100, 10)
    assert [d.phy_offset for d in got] == [3]
    w.mark_delivered(got, T0 + 123)
    outcome = w.cancel(T0 + 20, T0, 3, T0 + 200)
    assert (outcome.state, outcome.time_ms) == (EntryState.DELIVERED, T0 + 123)
    # The cancels were made durable before cancel() returned: a restart keeps them.
    again = _wheel(tmp_path)
    again.advance(T0 + 10 * MIN)
    assert again.pop_due(T0 + 10 * MIN, 10) == []
    assert again.cancel(T0 + 5 * MIN, T0, 2, T0).state == EntryState.CANCELLED


def test_in_flight_cancel_says_so(tmp_path: Path) -> None:
    w = _wheel(tmp_path)
    w.add([(T0 + 10, T0, 1)])
    w.advance(T0)
    w.pop_due(T0 + 10, 10)
    assert w.cancel(T0 + 10, T0, 1, T0 + 11).state == EntryState.SENDING


def test_failed_delivery_is_retried_later(tmp_path: Path) -> None:
    w = _wheel(tmp_path)
    w.add([(T0 + 10, T0, 1)])
    w.advance(T0)
    got = w.pop_due(T0 + 10, 10)
    w.retry(got, T0 + 1000)
    assert w.pop_due(T0 + 999, 10) == []
    again = w.pop_due(T0 + 1000, 10)
    assert [(d.due_ms, d.phy_offset) for d in again] == [(T0 + 10, 1)]


def test_finished_buckets_close_and_their_files_go(tmp_path: Path) -> None:
    w = _wheel(tmp_path)
    w.add([(T0 + 10, T0, 1)])
    w.advance(T0)
    got = w.pop_due(T0 + 10, 10)
    w.mark_delivered(got, T0 + 10)
    w.flush()
    assert not w.close_ready(T0 + MIN)  # within the grace period
    assert w.close_ready(T0 + MIN + CLOSE_GRACE_MS)
    assert w.closed_below == T0 // MIN + 1
    assert not (w.dir / "000000001000.bkt").exists()
    assert (w.dir / "000000001000.jnl").exists()  # kept to answer cancels
    assert w.expire_journals(T0 + 100 * 3_600_000) == 1


def test_a_month_of_pending_entries_keeps_memory_to_the_window(tmp_path: Path) -> None:
    w = _wheel(tmp_path)
    month_ms = 30 * 24 * 3_600_000
    n = 20_000
    w.add([(T0 + i * (month_ms // n), T0, i) for i in range(n)])
    w.flush()
    w.advance(T0)
    assert w.loaded <= 2  # a minute of a month
    assert w.pending == n
    reopened = _wheel(tmp_path)
    assert reopened.pending == n  # counted from the files on open


def test_torn_bucket_file_still_loads_its_whole_entries(tmp_path: Path) -> None:
    w = _wheel(tmp_path)
    w.add([(T0 + 10, T0, 1), (T0 + 20, T0, 2)])
    w.flush()
    path = w.dir / "000000001000.bkt"
    with open(path, "ab") as f:
        f.write(b"\x01\x02\x03")  # a torn third entry
    again = _wheel(tmp_path)
    again.add([(T0 + 30, T0, 3)])  # the next append cuts the torn tail first
    again.flush()
    again.advance(T0)
    assert [d.phy_offset for d in again.pop_due(T0 + 100, 10)] == [1, 2, 3]
