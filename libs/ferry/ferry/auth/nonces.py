"""The replay guard: a signed request is accepted once, and only while it is fresh.

A request's timestamp must lie within ±`window_ms` of this server's clock
(so a captured request is useless after the window), and its nonce must not
have been seen for the same access key within the window (so it cannot be
replayed inside it either). Nonces are kept in buckets by the second of their
request's timestamp: a replay carries the same signed timestamp, so only one
bucket is looked at, and a bucket is dropped whole once the window has moved
past it. Memory is bounded: over `max_entries` nonces a request is refused
with BusyError (counted) rather than remembered badly.
"""
from __future__ import annotations

import time
from collections.abc import Callable

from ferry.errors import AuthenticationError, BusyError

#: How far a request's timestamp may be from the server's clock, either way.
DEFAULT_WINDOW_MS = 60_000
#: How many nonces the guard holds at most (about 100 bytes each).
DEFAULT_MAX_NONCES = 500_000
_BUCKET_MS = 1000


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000


class ReplayGuard:
    """Refuses stale timestamps and nonces already seen (per access key) within the window."""

    def __init__(self, window_ms: int = DEFAULT_WINDOW_MS,
                 max_entries: int = DEFAULT_MAX_NONCES,
                 clock: Callable[[], int] = _wall_ms) -> None:
        if window_ms <= 0 or max_entries <= 0:
            raise ValueError("window_ms and max_entries must be positive")
        self.window_ms = window_ms
        self.max_entries = max_entries
        self._clock = clock
        self._buckets: dict[int, set[bytes]] = {}
        self._entries = 0
        self._oldest_kept = 0  # every bucket below this second has been dropped
        self.refused_stale = 0
        self.refused_replay = 0
        self.refused_full = 0

    def __len__(self) -> int:
        return self._entries

    def check_time(self, ts_ms: int) -> None:
        """Raise AuthenticationError when `ts_ms` is outside ±window of now."""
        skew_ms = ts_ms - self._clock()
        if -self.window_ms <= skew_ms <= self.window_ms:
            return
        self.refused_stale += 1
        side = "old" if skew_ms < 0 else "far in the future"
        raise AuthenticationError(
            f"stale timestamp: the request is {abs(skew_ms)} ms {side}; requests must be within "
            f"{self.window_ms} ms of the server's clock (check the client's clock)")

    def remember(self, access_key: str, ts_ms: int, nonce: bytes) -> None:
        """Record a nonce; raise AuthenticationError when it was seen already.

        Call after `check_time` and after the signature was verified.
        """
        now = self._clock()
        self._expire(now)
        second = ts_ms // _BUCKET_MS
        if second < self._oldest_kept:
            # Its bucket is already dropped: it would be accepted twice. Only a
            # timestamp at the very edge of the window lands here.
            self.refused_stale += 1
            raise AuthenticationError("stale timestamp: the request is at the edge of the window")
        entry = nonce + access_key.encode("ascii")
        bucket = self._buckets.get(second)
        if bucket is None:
            bucket = self._buckets[second] = set()
        elif entry in bucket:
            self.refused_replay += 1
            raise AuthenticationError(
                f"replayed request: nonce {nonce.hex()} was already used by {access_key!r}")
        if self._entries >= self.max_entries:
            self.refused_full += 1
            raise BusyError("too many signed requests in the replay window; try again shortly")
        bucket.add(entry)
        self._entries += 1

    def _expire(self, now_ms: int) -> None:
        """Drop the buckets the window has moved past."""
        oldest = (now_ms - self.window_ms) // _BUCKET_MS
        if oldest <= self._oldest_kept:
            return
        self._oldest_kept = oldest
        for second in [s for s in self._buckets if s < oldest]:
            self._entries -= len(self._buckets.pop(second))

    def stats(self) -> dict[str, int]:
        """Counters for /v1/stats: nonces held and requests refused, by reason."""
        return {"nonces": self._entries, "refused_stale": self.refused_stale,
                "refused_replay": self.refused_replay, "refused_full": self.refused_full}
