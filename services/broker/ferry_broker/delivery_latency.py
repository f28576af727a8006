"""End-to-end delivery latency: how long messages waited in the store before a group got them.

For every record a PULL answer hands to a member of a group, its age at that
moment (the broker's clock now minus the record's store timestamp) is added
to the (group, topic) totals here, with the number of records. A reader of
two readings divides the growth of the sum by the growth of the count: the
mean latency of the messages delivered between them (the console's latency
charts, `rate(..._latency_seconds_total) / rate(..._delivered_total)` in
PromQL). Delivery, not commit: a consumer commits on an interval (5 s by
default), which would dominate the figure; the time a handler then takes is
the client's to measure.

The totals only grow while the process lives (a restart starts them from 0)
and are this broker's own: a slave serving pulls counts the pulls it serves,
so readers add every member's totals. Bounded: at most `MAX_ENTRIES` (group,
topic) pairs; past it the pair delivered to least recently is dropped.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from ferry.codec.record import AT_STORE_TS_MS, I64

#: (group, topic) pairs kept at most (PULLs name existing queues, so rarely near it).
MAX_ENTRIES = 100_000


class DeliveryLatency:
    """Per (group, topic): records delivered and the sum of their ages at delivery (ms)."""

    def __init__(self, max_entries: int = MAX_ENTRIES,
                 clock_ms: Callable[[], float] | None = None) -> None:
        self._totals: dict[tuple[str, str], list[int]] = {}   # -> [delivered, age sum ms]
        self._max = max_entries
        self._clock_ms = clock_ms or (lambda: time.time() * 1000)

    def __len__(self) -> int:
        return len(self._totals)

    def record(self, group: str, topic: str, records: Sequence[memoryview | bytes]) -> None:
        """Count `records` (raw, as the store keeps them) as delivered to `group` now."""
        # On the pull path: one C-level unpack per record, summed in one list (a quarter of
        # the cost of a loop that clamps each age); a batch stored "after now" (a clock
        # stepped back) counts 0, not less.
        unpack = I64.unpack_from
        stored_ms = sum([unpack(raw, AT_STORE_TS_MS)[0] for raw in records])
        age_ms = max(0, int(self._clock_ms()) * len(records) - stored_ms)
        key = (group, topic)
        totals = self._totals.pop(key, None)
        if totals is None:
            totals = [0, 0]
            while len(self._totals) >= self._max:
                del self._totals[next(iter(self._totals))]
        totals[0] += len(records)
        totals[1] += age_ms
        self._totals[key] = totals   # at the end: the most recently delivered to

    def items(self) -> list[tuple[str, str, int, int]]:
        """(group, topic, delivered, age sum ms) of every pair."""
        return [(g, t, n, s) for (g, t), (n, s) in self._totals.items()]

    def as_json(self) -> dict[str, Any]:
        """/v1/stats `delivery`: {group: {topic: {"delivered": n, "latency_ms_sum": s}}}."""
        out: dict[str, dict[str, dict[str, int]]] = {}
        for group, topic, n, s in sorted(self.items()):
            out.setdefault(group, {})[topic] = {"delivered": n, "latency_ms_sum": s}
        return out
