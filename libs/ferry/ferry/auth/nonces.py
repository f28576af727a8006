"""The replay guard: a signed request is accepted once, and only while it is fresh.

A request's timestamp must lie within `window_ms` behind and `future_ms`
ahead of this server's clock (so a captured request is useless after the
window), must not be older than this process (so a request captured before a
restart cannot be replayed after it: the nonces it would be checked against
died with the old process), and its nonce must not have been seen for the
same access key within the window (so it cannot be replayed inside it
either). Nonces are kept in buckets by the second of their request's
timestamp, and inside a bucket by access key: a replay carries the same
signed timestamp, so only one set is looked at, and a bucket is dropped whole
once the window has moved past it.

Memory is bounded twice: one access key holds at most `max_per_key` nonces
(its own quota: an identity that floods is refused alone, with BusyError
naming the quota), and all of them at most `max_entries` (BusyError too,
counted). Callers remember a nonce only once the request is both authentic
and permitted, so refusals cost no slot.
"""
from __future__ import annotations

import time
from collections.abc import Callable

from ferry.errors import AuthenticationError, BusyError

#: How far behind the server's clock a request's timestamp may be.
DEFAULT_WINDOW_MS = 60_000
#: How far ahead of the server's clock a request's timestamp may be (clock skew only:
#: every nonce is held until its timestamp leaves the window, so a wide allowance here
#: would let one request hold its slot for longer).
DEFAULT_FUTURE_MS = 5_000
#: How many nonces the guard holds at most (about 100 bytes each).
DEFAULT_MAX_NONCES = 500_000
#: How many of them one access key may hold (about 1,600 signed requests a second,
#: sustained over a 60 s window).
DEFAULT_MAX_NONCES_PER_KEY = 100_000
_BUCKET_MS = 1000


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000


class ReplayGuard:
    """Refuses stale timestamps and nonces already seen (per access key) within the window;
    bounds the nonces of each access key and of all of them."""

    def __init__(self, window_ms: int = DEFAULT_WINDOW_MS,
                 max_entries: int = DEFAULT_MAX_NONCES,
                 clock: Callable[[], int] = _wall_ms, *,
                 future_ms: int = DEFAULT_FUTURE_MS,
                 max_per_key: int = DEFAULT_MAX_NONCES_PER_KEY) -> None:
        if window_ms <= 0 or max_entries <= 0 or max_per_key <= 0 or future_ms < 0:
            raise ValueError("window_ms, max_entries and max_per_key must be positive, "
                             "future_ms not negative")
        self.window_ms = window_ms
        self.future_ms = future_ms
        self.max_entries = max_entries
        self.max_per_key = min(max_per_key, max_entries)
        self._clock = clock
        #: No request signed before this instant is accepted (see the module docstring).
        self.started_ms = clock()
        self._buckets: dict[int, dict[str, set[bytes]]] = {}
        self._per_key: dict[str, int] = {}
        self._entries = 0
        self._oldest_kept = 0  # every bucket below this second has been dropped
        self.refused_stale = 0
        self.refused_replay = 0
        self.refused_full = 0
        self.refused_quota = 0

    def __len__(self) -> int:
        return self._entries

    def held_by(self, access_key: str) -> int:
        """How many nonces `access_key` holds now."""
        return self._per_key.get(access_key, 0)

    def check_time(self, ts_ms: int) -> None:
        """Raise AuthenticationError when `ts_ms` is outside the window or before this
        process started."""
        skew_ms = ts_ms - self._clock()
        if -self.window_ms <= skew_ms <= self.future_ms and ts_ms >= self.started_ms:
            return
        self.refused_stale += 1
        if skew_ms > self.future_ms:
            raise AuthenticationError(
                f"stale timestamp: the request is {skew_ms} ms in the future; at most "
                f"{self.future_ms} ms ahead of the server's clock is accepted (check the "
                "client's clock)")
        if ts_ms < self.started_ms and -skew_ms <= self.window_ms:
            raise AuthenticationError(
                f"stale timestamp: the request was signed {self.started_ms - ts_ms} ms before "
                "this server started; sign it again (a request made before a restart is "
                "never accepted after it)")
        raise AuthenticationError(
            f"stale timestamp: the request is {-skew_ms} ms old; requests must be at most "
            f"{self.window_ms} ms behind the server's clock (check the client's clock)")

    def remember(self, access_key: str, ts_ms: int, nonce: bytes) -> None:
        """Record a nonce; raise AuthenticationError when it was seen already, BusyError
        when its access key (or the guard) holds all it may.

        Call after `check_time`, once the signature is verified and the request permitted.
        """
        now = self._clock()
        self._expire(now)
        second = ts_ms // _BUCKET_MS
        if second < self._oldest_kept:
            # Its bucket is already dropped: it would be accepted twice. Only a
            # timestamp at the very edge of the window lands here.
            self.refused_stale += 1
            raise AuthenticationError("stale timestamp: the request is at the edge of the window")
        bucket = self._buckets.get(second)
        if bucket is None:
            bucket = self._buckets[second] = {}
        seen = bucket.get(access_key)
        if seen is not None and nonce in seen:
            self.refused_replay += 1
            raise AuthenticationError(
                f"replayed request: nonce {nonce.hex()} was already used by {access_key!r}")
        held = self._per_key.get(access_key, 0)
        if held >= self.max_per_key:
            self.refused_quota += 1
            raise BusyError(
                f"access key {access_key!r} is over its quota of {self.max_per_key} signed "
                f"requests in the {self.window_ms} ms replay window; slow down and try again")
        if self._entries >= self.max_entries:
            self.refused_full += 1
            raise BusyError("too many signed requests in the replay window; try again shortly")
        if seen is None:
            seen = bucket[access_key] = set()
        seen.add(nonce)
        self._per_key[access_key] = held + 1
        self._entries += 1

    def _expire(self, now_ms: int) -> None:
        """Drop the buckets the window has moved past."""
        oldest = (now_ms - self.window_ms) // _BUCKET_MS
        if oldest <= self._oldest_kept:
            return
        self._oldest_kept = oldest
        per_key = self._per_key
        for second in [s for s in self._buckets if s < oldest]:
            for access_key, nonces in self._buckets.pop(second).items():
                self._entries -= len(nonces)
                left = per_key[access_key] - len(nonces)
                if left:
                    per_key[access_key] = left
                else:
                    del per_key[access_key]

    def stats(self) -> dict[str, int]:
        """Counters for /v1/stats: nonces held and requests refused, by reason."""
        return {"nonces": self._entries, "access_keys": len(self._per_key),
                "refused_stale": self.refused_stale, "refused_replay": self.refused_replay,
                "refused_full": self.refused_full, "refused_quota": self.refused_quota}
