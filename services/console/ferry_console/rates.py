"""Topic rates: messages stored per second, from the brokers' max offsets sampled over time.

A broker reports each queue's max offset (the next to write) in `/v1/stats`;
the sum over a topic's queues grows by one per stored message. The sampler
reads every broker each `rate_interval_ms` and keeps the last two sums per
topic: the rate is their difference over the time between them (None until
two samples exist, or when a broker's answer was missing from one of them).
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable

from ferry_console.sources import BrokerView, Sources

log = logging.getLogger("ferry_console")


def topic_totals(brokers: Iterable[BrokerView]) -> dict[str, int]:
    """Per topic, the sum of its queues' max offsets over the brokers that answered
    (masters only: a slave holds the same queues)."""
    out: dict[str, int] = {}
    for b in brokers:
        if b.stats is None or b.role == "slave":
            continue
        for topic, queues in (b.stats.get("topics") or {}).items():
            out[topic] = out.get(topic, 0) + sum(int(q.get("max_offset", 0))
                                                 for q in queues.values())
    return out


class RateSampler:
    """Samples topic totals; `rate(topic)` in messages per second."""

    def __init__(self, sources: Sources, interval_ms: int) -> None:
        self.sources = sources
        self.interval_ms = interval_ms
        self._previous: tuple[float, dict[str, int]] | None = None
        self._latest: tuple[float, dict[str, int]] | None = None

    def add(self, at_s: float, totals: dict[str, int]) -> None:
        self._previous, self._latest = self._latest, (at_s, totals)

    def rate(self, topic: str) -> float | None:
        if self._previous is None or self._latest is None:
            return None
        (t0, before), (t1, after) = self._previous, self._latest
        if t1 <= t0 or topic not in before or topic not in after:
            return None
        return max(0, after[topic] - before[topic]) / (t1 - t0)

    async def run(self) -> None:
        while True:
            try:
                self.add(time.monotonic(), topic_totals(await self.sources.brokers()))
            except asyncio.CancelledError:
                raise
            except Exception as exc:   # namesrv down: try again next round
                log.info("rate sample failed: %s", exc)
            await asyncio.sleep(self.interval_ms / 1000)
