"""The console's chart memory: bounded time series held in-process, one per (metric, subject).

A series is a ring of the last `max_points` (time, value) samples. The
store holds at most `max_series` series: a new one past the cap first drops
the series updated least recently (a deleted topic's or a gone broker's), so
memory stays bounded whatever the cluster holds (about 100 bytes a point:
`max_series * max_points` points at most). Times are wall-clock seconds, as
the chart's x axis shows them.
"""
from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass

#: What a chart draws: (seconds since the epoch, value), oldest first.
Points = list[tuple[float, float]]


@dataclass(frozen=True, order=True)
class SeriesKey:
    """One series: a metric (`topic.produce_rate`, `group.lag`, ...) of one subject (a
    topic, a group or a broker member)."""

    metric: str
    subject: str


class SeriesStore:
    """The last `max_points` samples of at most `max_series` series."""

    def __init__(self, max_points: int, max_series: int) -> None:
        if max_points < 1 or max_series < 1:
            raise ValueError("max_points and max_series must be at least 1")
        self.max_points = max_points
        self.max_series = max_series
        self._series: OrderedDict[SeriesKey, deque[tuple[float, float]]] = OrderedDict()
        self.dropped_series = 0   # series dropped to make room (the cap was reached)

    def add(self, key: SeriesKey, at_s: float, value: float) -> None:
        ring = self._series.get(key)
        if ring is None:
            while len(self._series) >= self.max_series:
                self._series.popitem(last=False)
                self.dropped_series += 1
            ring = self._series[key] = deque(maxlen=self.max_points)
        else:
            self._series.move_to_end(key)
        ring.append((at_s, value))

    def points(self, key: SeriesKey) -> Points:
        return list(self._series.get(key, ()))

    def subjects(self, metric: str, prefix: str = "") -> list[str]:
        """The subjects of `metric` that start with `prefix`, sorted (one pass over the
        series: at most `max_series`)."""
        return sorted(k.subject for k in self._series
                      if k.metric == metric and k.subject.startswith(prefix))

    def latest(self, key: SeriesKey) -> tuple[float, float] | None:
        ring = self._series.get(key)
        return ring[-1] if ring else None

    def __len__(self) -> int:
        return len(self._series)
