"""PendingResets (offset_resets.py): a mark redirects other offsets until a PULL at the
reset position clears it, and it expires and is bounded."""
from __future__ import annotations

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
