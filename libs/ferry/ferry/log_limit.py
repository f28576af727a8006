"""Rate-limited logging for every line a client can make a server write.

A client that sends bad frames, unsigned requests or wrong passwords in a loop
must not fill the server's disk with log lines (issue 23). `LogLimiter` counts
lines in windows of `interval_s`: in one window it writes at most `burst` lines
per key and at most `total` lines over all keys; the others are only counted.
The first line after a window that suppressed some is preceded by one summary,
"suppressed K similar lines in the last N s", with the counts of the most
suppressed keys (`suppressed_by_key`). So a flood costs at most `total` + 1
lines a window, however many clients or keys it uses.

Keys name a kind of event (an error class, an HTTP status and path); a window
tracks at most `max_keys` of them, later ones share the key "(other)".

Leaf module: logging and time only, so the library, the wire and HTTP servers and
every service can use it.
"""
from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

#: Lines per key, and in all, per window; the window.
BURST = 10
TOTAL = 200
INTERVAL_S = 60.0
MAX_KEYS = 1024
OTHER = "(other)"
#: Keys the summary line names (the most suppressed first).
SUMMARY_KEYS = 10


class LogLimiter:
    """Writes a logger's lines at most `burst` times per key and `total` times in all per
    window of `interval_s`."""

    def __init__(self, logger: logging.Logger, burst: int = BURST, total: int = TOTAL,
                 interval_s: float = INTERVAL_S, max_keys: int = MAX_KEYS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if min(burst, total, max_keys) < 1 or interval_s <= 0:
            raise ValueError("burst, total, interval_s and max_keys must be positive")
        self.logger = logger
        self._burst, self._total, self._interval = burst, total, interval_s
        self._max_keys, self._clock = max_keys, clock
        self._started = clock()
        self._logged: Counter[str] = Counter()
        self._written = 0  # in this window
        self._held: Counter[str] = Counter()  # suppressed in this window
        self._level = logging.INFO  # of the summary: the highest suppressed level
        self.suppressed = 0  # lines not written since start, over all keys

    def log(self, level: int, key: str, msg: str, *args: object, **kwargs: Any) -> bool:
        """Log `msg % args` unless `key` (or the window) used up its share; whether it was."""
        if not self.logger.isEnabledFor(level):
            return False
        now = self._clock()
        if now - self._started >= self._interval:
            self._next_window(now)
        if key not in self._logged and len(self._logged) >= self._max_keys:
            key = OTHER
        if self._logged[key] >= self._burst or self._written >= self._total:
            self._held[key] += 1
            self._level = max(self._level, level)
            self.suppressed += 1
            return False
        self._logged[key] += 1
        self._written += 1
        kwargs.setdefault("stacklevel", 2)
        self.logger.log(level, msg, *args, **kwargs)
        return True

    def info(self, key: str, msg: str, *args: object, **kwargs: Any) -> bool:
        kwargs.setdefault("stacklevel", 3)
        return self.log(logging.INFO, key, msg, *args, **kwargs)

    def warning(self, key: str, msg: str, *args: object, **kwargs: Any) -> bool:
        kwargs.setdefault("stacklevel", 3)
        return self.log(logging.WARNING, key, msg, *args, **kwargs)

    def _next_window(self, now: float) -> None:
        held = self._held
        if held:
            top = dict(held.most_common(SUMMARY_KEYS))
            self.logger.log(self._level, "suppressed %d similar lines in the last %.0f s",
                            held.total(), now - self._started,
                            extra={"suppressed": held.total(), "suppressed_by_key": top})
        self._started = now
        self._logged, self._held, self._written = Counter(), Counter(), 0
        self._level = logging.INFO
