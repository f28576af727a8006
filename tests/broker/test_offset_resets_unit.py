"""PendingResets (offset_resets.py): a mark redirects other offsets until a PULL at the
reset position clears it, and it expires and is bounded; saved marks are taken back at
start where the committed offset is still theirs."""
from __future__ import annotations

from pathlib import Path

import pytest
from ferry_broker.offset_resets import PendingResets

KEY = ("g", "t", 0)


def test_a_mark_redirects_until_a_pull_at_the_reset_position() -> None:
    resets = PendingResets()
    assert resets.redirect(KEY, 7) is None
    resets.mark(KEY, 3)
    assert resets.get(KEY) == 3 and resets.redirect(KEY, 7) == 3
    assert resets.redirect(KEY, 3) is None and resets.get(KEY) is None
    assert resets.redirect(KEY, 7) is None


def test_marks_expire_and_are_bounded() -> None:
    now = [0.0]
    resets = PendingResets(max_entries=2, ttl_ms=1000, clock_ms=lambda: now[0])
    resets.mark(KEY, 1)
    now[0] = 999
    assert resets.get(KEY) == 1
    now[0] = 1000
    assert resets.redirect(KEY, 5) is None and len(resets) == 0
    for q in range(3):
        resets.mark(("g", "t", q), q)
    assert len(resets) == 2 and resets.get(("g", "t", 0)) is None


def test_marks_saved_are_taken_back_where_the_committed_offset_is_still_theirs(
        tmp_path: Path) -> None:
    path = tmp_path / "config" / "pending_resets.json"
    resets = PendingResets(path=path)
    for q, offset in ((0, 3), (1, 5), (2, 0)):
        resets.mark(("g", "t", q), offset)
    resets.write_snapshot(*resets.snapshot())
    assert resets.redirect(("g", "t", 2), 0) is None   # picked up: not written again
    committed = {("g", "t", 0): 3, ("g", "t", 1): 9, ("g", "t", 2): 0}
    again = PendingResets(path=path)
    # queue 1 committed past its mark (a member picked it up): dropped
    assert again.load(lambda key: committed.get(key, -1)) == 2
    assert again.get(("g", "t", 0)) == 3 and again.get(("g", "t", 1)) is None
    assert again.get(("g", "t", 2)) == 0
    assert PendingResets(path=tmp_path / "none.json").load(lambda key: 0) == 0


def test_an_older_snapshot_does_not_overwrite_a_newer_one(tmp_path: Path) -> None:
    path = tmp_path / "pending_resets.json"
    resets = PendingResets(path=path)
    resets.mark(KEY, 1)
    old = resets.snapshot()
    resets.mark(KEY, 2)
    resets.write_snapshot(*resets.snapshot())
    resets.write_snapshot(*old)
    assert PendingResets(path=path).load(lambda key: 2) == 1


def test_a_damaged_file_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "pending_resets.json"
    path.write_text("{not json")
    with pytest.raises(ValueError, match="pending_resets.json"):
        PendingResets(path=path).load(lambda key: 0)
