"""ReplayGuard: the time window, the process start, replays per access key, bounded memory
per identity and in all."""
from __future__ import annotations

import pytest
from ferry.auth.nonces import ReplayGuard
from ferry.errors import AuthenticationError, BusyError


class Clock:
    def __init__(self, now_ms: int = 1_700_000_000_000) -> None:
        self.now_ms = now_ms

    def __call__(self) -> int:
        return self.now_ms


def started_long_ago(clock: Clock, **kwargs: int) -> ReplayGuard:
    """A guard whose process started 10 minutes before `clock`'s now."""
    now = clock.now_ms
    clock.now_ms -= 600_000
    guard = ReplayGuard(clock=clock, **kwargs)
    clock.now_ms = now
    return guard


def test_timestamps_outside_the_window_are_stale() -> None:
    clock = Clock()
    guard = started_long_ago(clock, window_ms=60_000, future_ms=5_000)
    guard.check_time(clock.now_ms - 60_000)
    guard.check_time(clock.now_ms + 5_000)
    with pytest.raises(AuthenticationError, match="stale timestamp.*old"):
        guard.check_time(clock.now_ms - 60_001)
    with pytest.raises(AuthenticationError, match="stale timestamp.*future"):
        guard.check_time(clock.now_ms + 5_001)
    assert guard.stats()["refused_stale"] == 2


def test_only_a_small_skew_into_the_future_is_accepted() -> None:
    """A timestamp 59 s ahead would hold its nonce for two windows: refused."""
    clock = Clock()
    guard = started_long_ago(clock)
    with pytest.raises(AuthenticationError, match="future"):
        guard.check_time(clock.now_ms + 59_000)


def test_nothing_signed_before_the_process_started_is_accepted() -> None:
    clock = Clock()
    before_restart = clock.now_ms
    clock.now_ms += 2_000   # the process starts 2 s later, well inside the window
    guard = ReplayGuard(clock=clock)
    with pytest.raises(AuthenticationError, match="before this server started"):
        guard.check_time(before_restart)
    guard.check_time(clock.now_ms)


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
    guard.remember("bob", clock.now_ms, b"b" * 16)
    assert len(guard) == 101 and guard.held_by("alice") == 100
    clock.now_ms += 12_000
    guard.remember("alice", clock.now_ms, b"x" * 16)
    assert len(guard) == 1 and guard.held_by("alice") == 1 and guard.held_by("bob") == 0
    assert guard.stats()["access_keys"] == 1


def test_over_the_cap_requests_are_refused_busy_not_forgotten() -> None:
    clock = Clock()
    guard = ReplayGuard(max_entries=3, clock=clock)
    for i in range(3):
        guard.remember(f"key{i}", clock.now_ms, i.to_bytes(16, "big"))
    with pytest.raises(BusyError, match="too many"):
        guard.remember("alice", clock.now_ms, b"z" * 16)
    # A replay is still recognised as one at the cap.
    with pytest.raises(AuthenticationError, match="replayed"):
        guard.remember("key0", clock.now_ms, (0).to_bytes(16, "big"))
    assert guard.stats()["refused_full"] == 1


def test_an_identity_over_its_quota_is_refused_alone() -> None:
    clock = Clock()
    guard = ReplayGuard(max_entries=100, max_per_key=10, clock=clock)
    for i in range(10):
        guard.remember("mallory", clock.now_ms + 4_000, i.to_bytes(16, "big"))
    with pytest.raises(BusyError, match="'mallory' is over its quota of 10"):
        guard.remember("mallory", clock.now_ms, b"m" * 16)
    for key in ("alice", "bob"):   # everyone else goes on, each within their own quota
        for i in range(10):
            guard.remember(key, clock.now_ms, i.to_bytes(16, "big"))
    assert guard.stats()["refused_quota"] == 1 and guard.held_by("mallory") == 10
    # Its quota frees as the window passes its requests.
    clock.now_ms += 70_000
    guard.remember("mallory", clock.now_ms, b"m" * 16)
    assert guard.held_by("mallory") == 1


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError):
        ReplayGuard(max_per_key=0)
    with pytest.raises(ValueError):
        ReplayGuard(future_ms=-1)
