"""ReplayGuard: the time window, replays per access key, bounded memory."""
from __future__ import annotations

import pytest
from ferry.auth.nonces import ReplayGuard
from ferry.errors import AuthenticationError, BusyError


class Clock:
    def __init__(self, now_ms: int = 1_700_000_000_000) -> None:
        self.now_ms = now_ms

    def __call__(self) -> int:
        return self.now_ms


def test_timestamps_outside_the_window_are_stale() -> None:
    clock = Clock()
    guard = ReplayGuard(window_ms=60_000, clock=clock)
    guard.check_time(clock.now_ms - 60_000)
    guard.check_time(clock.now_ms + 60_000)
    with pytest.raises(AuthenticationError, match="stale timestamp.*old"):
        guard.check_time(clock.now_ms - 60_001)
    with pytest.raises(AuthenticationError, match="stale timestamp.*future"):
        guard.check_time(clock.now_ms + 60_001)
    assert guard.stats()["refused_stale"] == 2


def test_a_nonce_is_accepted_once_per_access_key() -> None:
    clock = Clock()
    guard = ReplayGuard(clock=clock)
    nonce = b"n" * 16
    guard.remember("alice", clock.now_ms, nonce)
    with pytest.raises(AuthenticationError, match="replayed"):
        guard.remember("alice", clock.now_ms, nonce)
    guard.remember("bob", clock.now_ms, nonce)  # another identity's nonces are its own
    assert guard.stats()["refused_replay"] == 1 and len(guard) == 2


def test_old_buckets_are_dropped_as_the_window_moves() -> None:
    clock = Clock()
    guard = ReplayGuard(window_ms=10_000, clock=clock)
    for i in range(100):
        guard.remember("alice", clock.now_ms, i.to_bytes(16, "big"))
    assert len(guard) == 100
    clock.now_ms += 12_000
    guard.remember("alice", clock.now_ms, b"x" * 16)
    assert len(guard) == 1


def test_over_the_cap_requests_are_refused_busy_not_forgotten() -> None:
    clock = Clock()
    guard = ReplayGuard(max_entries=3, clock=clock)
    for i in range(3):
        guard.remember("alice", clock.now_ms, i.to_bytes(16, "big"))
    with pytest.raises(BusyError):
        guard.remember("alice", clock.now_ms, b"z" * 16)
    # A replay is still recognised as one at the cap.
    with pytest.raises(AuthenticationError, match="replayed"):
        guard.remember("alice", clock.now_ms, (0).to_bytes(16, "big"))
    assert guard.stats()["refused_full"] == 1
