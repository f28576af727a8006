"""Login throttling: a budget of failed logins per client address and per access key.

Each login the console checks costs a signed request to namesrv, and a
guesser should get few tries. A key (an address, or an access key) may fail
`budget` times within `window_ms` of its first failure; past that, every login
from that address, or for that access key, is refused with 429 before anything
is asked of namesrv, until the window ends. An attempt counts from the
moment it is let through (parallel guesses cannot all pass the check) and is
taken back only if it was not a wrong secret; a successful login resets
nothing else (a valid account must not buy an address more guesses).

The per-address budget stops one source; the per-identity one stops many
sources guessing one secret together. The latter lets anyone who fails on
purpose keep that identity out of the console for a window at a time (never
out of the mesh: its clients sign without the console), which is the usual
price of per-account throttling; the per-identity budget is the larger one.

Memory is bounded: at most `max_keys` keys per table; once full (a flood from
more addresses than that within a window), keys not yet in it share one
overflow count with the same budget.
"""
from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

#: The keys a table follows at once; past it new keys share the overflow count.
MAX_KEYS = 100_000
OVERFLOW = "\0overflow"


def _monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000


@dataclass(slots=True)
class _Count:
    since_ms: int
    failures: int = 0


class FailureBudget:
    """Failures per key within a window of `window_ms` from the key's first failure."""

    def __init__(self, budget: int, window_ms: int, max_keys: int = MAX_KEYS,
                 clock: Callable[[], int] = _monotonic_ms) -> None:
        self.budget = budget
        self.window_ms = window_ms
        self.max_keys = max_keys
        self._clock = clock
        # insertion order = the order the windows began (an OrderedDict: dropping from
        # the front stays O(1), a dict's iteration would walk past the deleted slots)
        self._counts: OrderedDict[str, _Count] = OrderedDict()

    def _live(self, key: str) -> _Count | None:
        count = self._counts.get(key)
        if count is None and len(self._counts) >= self.max_keys:
            count = self._counts.get(OVERFLOW)
        if count is not None and self._clock() - count.since_ms >= self.window_ms:
            return None
        return count

    def retry_after_ms(self, key: str) -> int:
        """0 when `key` may try; else how long until its window ends."""
        count = self._live(key)
        if count is None or count.failures < self.budget:
            return 0
        return max(1, count.since_ms + self.window_ms - self._clock())

    def _key(self, key: str) -> str:
        return key if key in self._counts or len(self._counts) < self.max_keys else OVERFLOW

    def failed(self, key: str) -> None:
        """Count one failure of `key`."""
        now = self._clock()
        self._drop_ended(now)
        key = self._key(key)
        count = self._counts.get(key)
        if count is None or now - count.since_ms >= self.window_ms:
            self._counts.pop(key, None)
            count = self._counts[key] = _Count(now)
        count.failures += 1

    def forgive(self, key: str) -> None:
        """Take back one failure counted for `key` (an attempt that did not fail after all)."""
        count = self._counts.get(self._key(key))
        if count is not None and count.failures > 0:
            count.failures -= 1

    def _drop_ended(self, now: int) -> None:
        """Forget windows that have ended (the oldest first; stops at the first live one)."""
        while self._counts:
            key = next(iter(self._counts))
            if now - self._counts[key].since_ms < self.window_ms:
                break
            del self._counts[key]

    def __len__(self) -> int:
        return len(self._counts)


class LoginThrottle:
    """The console's two budgets: per client address and per access key."""

    def __init__(self, per_address: int, per_identity: int, window_ms: int = 60_000) -> None:
        self.by_address = FailureBudget(per_address, window_ms)
        self.by_identity = FailureBudget(per_identity, window_ms)
        self.refused = 0

    def attempt(self, address: str, access_key: str) -> tuple[str, int] | None:
        """Start a login from `address` for `access_key`: why it is refused now and in how
        many seconds to retry; or None, and then it counts as failed until `forgive` takes
        that back. Counting before namesrv answers means parallel guesses cannot all pass
        the check while the first ones are still being checked."""
        wait_ms = self.by_address.retry_after_ms(address)
        whose = "from your address"
        if not wait_ms and access_key:
            wait_ms = self.by_identity.retry_after_ms(access_key)
            whose = "for this access key"
        if wait_ms:
            self.refused += 1
            wait_s = -(-wait_ms // 1000)
            return f"too many failed logins {whose}: try again in {wait_s} s", wait_s
        self.by_address.failed(address)
        if access_key:
            self.by_identity.failed(access_key)
        return None

    def forgive(self, address: str, access_key: str) -> None:
        """The attempt did not fail on a wrong secret (a login, a full console, namesrv
        away): take back what `attempt` counted."""
        self.by_address.forgive(address)
        if access_key:
            self.by_identity.forgive(access_key)
