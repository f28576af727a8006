"""Counters and the lateness histogram shown by /v1/stats (and /metrics)."""
from __future__ import annotations

import bisect
from typing import Any

from opentelemetry.metrics import Histogram

#: Upper bounds (ms, inclusive) of the lateness histogram's buckets; the last is open.
LATENESS_BOUNDS_MS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10_000, 60_000)


class LatenessHistogram:
    """Lateness = acknowledgement time - DELIVER_AT_MS, in fixed buckets plus the maximum."""

    def __init__(self) -> None:
        self.counts = [0] * (len(LATENESS_BOUNDS_MS) + 1)
        self.total = 0
        self.max_ms = 0
        #: The /metrics histogram (seconds) each lateness is recorded in too, when set.
        self.sink: Histogram | None = None

    def add(self, lateness_ms: int) -> None:
        lateness_ms = max(0, lateness_ms)
        if self.sink is not None:
            self.sink.record(lateness_ms / 1000)
        self.counts[bisect.bisect_left(LATENESS_BOUNDS_MS, lateness_ms)] += 1
        self.total += 1
        if lateness_ms > self.max_ms:
            self.max_ms = lateness_ms

    def quantile(self, q: float) -> int:
        """The upper bound of the bucket holding quantile `q` (the max for the open bucket)."""
        if not self.total:
            return 0
        rank = q * self.total
        seen = 0
        for i, count in enumerate(self.counts):
            seen += count
            if seen >= rank and count:
                return LATENESS_BOUNDS_MS[i] if i < len(LATENESS_BOUNDS_MS) else self.max_ms
        return self.max_ms

    def to_json(self) -> dict[str, Any]:
        buckets = {f"le_{b}": c for b, c in zip(LATENESS_BOUNDS_MS, self.counts[:-1], strict=True)}
        buckets["inf"] = self.counts[-1]
        return {"count": self.total, "p50_ms": min(self.quantile(0.5), self.max_ms),
                "p99_ms": min(self.quantile(0.99), self.max_ms), "max_ms": self.max_ms,
                "buckets": buckets}


class Stats:
    """What the scheduler did since it started (pending counts come from the wheel)."""

    def __init__(self) -> None:
        self.taken = 0  # records taken over from brokers (into this term's cache)
        self.rolled = 0  # long-pending records stored again in %SCHEDULE% (roll.py)
        self.delivered = 0
        self.duplicates_after_crash = 0
        self.cancelled = 0
        self.delivery_errors = 0
        self.missing_records = 0  # wheel entries whose local record could not be read
        self.lateness = LatenessHistogram()
