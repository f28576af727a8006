"""The sampler behind rates and charts: every broker's `/v1/stats`, read each `rate_interval_ms`.

Each round reads every registered broker (with the console's own identity)
and adds one point to each series of `series.SeriesStore`:

| metric | subject | value |
|---|---|---|
| `topic.produce_rate` | topic | messages stored per second (its queues' max offsets) |
| `topic.consume_rate` | topic | messages consumed per second, all groups (committed offsets) |
| `group.consume_rate` | group | messages the group consumed per second, all its topics |
| `group.lag` | group | messages stored and not yet consumed by the group |
| `group.latency_ms` | group | mean end-to-end latency of the messages delivered to the group |
| `topic.group_latency_ms` | `<topic> <group>` | the same of one group on one topic |
| `broker.disk_used_percent` | broker member | the data disk's use |
| `broker.commit_log_bytes` | broker member | bytes its commit log holds |
| `broker.flush_lag_bytes` | broker member | bytes written and not yet flushed to disk |

A rate is the growth of its counters between two rounds over the time
between them, summed over the queues seen in both rounds: a broker missing
from one round, a queue or a group that appears, adds no spike (a group whose
offset moved back, by a reset, counts as zero). Masters only: a slave holds
the same queues. A latency is the growth of the brokers' delivery totals
(`/v1/stats` `delivery`, ferry_broker/delivery_latency.py) between two rounds:
the ages summed over the messages delivered, divided by their number; every
member counts, a slave too (it counts the pulls it serves itself); a round in
which nothing was delivered adds no point.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable

from ferry_console.series import SeriesKey, SeriesStore
from ferry_console.sources import BrokerView, Sources

log = logging.getLogger("ferry_console")

#: A counter of one queue on one broker (broker, group or "", topic, queue id).
Atom = tuple[str, str, str, str]
Counters = dict[SeriesKey, dict[Atom, int]]
#: Per latency series, per (member, group, topic): (messages delivered, their ages' sum ms).
Delivered = dict[SeriesKey, dict[Atom, tuple[int, int]]]


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


def member_name(b: BrokerView) -> str:
    """A broker member as charts name it: `broker-a/0`."""
    return f"{b.name}/{b.info.get('id', 0)}"


def counters(brokers: Iterable[BrokerView]) -> Counters:
    """The counters the rates grow from, per series, per queue."""
    out: Counters = {}
    for b in brokers:
        if b.stats is None or b.role == "slave":
            continue
        for topic, queues in (b.stats.get("topics") or {}).items():
            produced = out.setdefault(SeriesKey("topic.produce_rate", topic), {})
            for qid, q in queues.items():
                produced[(b.name, "", topic, qid)] = int(q.get("max_offset", 0))
        for group, topics in (b.stats.get("groups") or {}).items():
            by_group = out.setdefault(SeriesKey("group.consume_rate", group), {})
            for topic, queues in topics.items():
                by_topic = out.setdefault(SeriesKey("topic.consume_rate", topic), {})
                for qid, q in queues.items():
                    committed = int(q.get("committed_offset", -1))
                    if committed >= 0:
                        by_group[(b.name, group, topic, qid)] = committed
                        by_topic[(b.name, group, topic, qid)] = committed
    return out


def delivery_totals(brokers: Iterable[BrokerView]) -> Delivered:
    """Per latency series, per (member, group, topic): (messages delivered, their ages' sum)."""
    out: Delivered = {}
    for b in brokers:
        if b.stats is None:
            continue
        for group, topics in (b.stats.get("delivery") or {}).items():
            for topic, d in topics.items():
                totals = (int(d.get("delivered", 0)), int(d.get("latency_ms_sum", 0)))
                for key in (SeriesKey("group.latency_ms", group),
                            SeriesKey("topic.group_latency_ms", f"{topic} {group}")):
                    out.setdefault(key, {})[(member_name(b), group, topic, "")] = totals
    return out


def mean_growth(before: dict[Atom, tuple[int, int]], after: dict[Atom, tuple[int, int]],
                members_before: set[str]) -> float | None:
    """The mean age of the messages delivered between two readings (None: none was). An
    atom new on a member read both times grew from (0, 0); one whose member was not read
    before, or whose count went down (its broker restarted), is left out."""
    grown = []
    for atom, (n, s) in after.items():
        if atom in before:
            n0, s0 = before[atom]
        elif atom[0] in members_before:
            n0, s0 = 0, 0
        else:
            continue
        if n >= n0:
            grown.append((n - n0, s - s0))
    count = sum(n for n, _ in grown)
    return sum(s for _, s in grown) / count if count > 0 else None


def gauges(brokers: Iterable[BrokerView]) -> dict[SeriesKey, float]:
    """The values charted as they are: a group's lag, each member's disk and flush."""
    out: dict[SeriesKey, float] = {}
    for b in brokers:
        if b.stats is None:
            continue
        store = b.stats.get("store") or {}
        member = member_name(b)
        out[SeriesKey("broker.disk_used_percent", member)] = round(
            float(store.get("disk_used_ratio", 0)) * 100, 2)
        top = int(store.get("commit_log_max_offset", 0))
        out[SeriesKey("broker.commit_log_bytes", member)] = top - int(
            store.get("commit_log_min_offset", 0))
        out[SeriesKey("broker.flush_lag_bytes", member)] = max(
            0, top - int(store.get("flushed_offset", top)))
        if b.role == "slave":
            continue
        for group, topics in (b.stats.get("groups") or {}).items():
            key = SeriesKey("group.lag", group)
            out[key] = out.get(key, 0) + sum(int(q.get("lag", 0)) for queues in topics.values()
                                             for q in queues.values())
    return out


def growth_per_s(before: dict[Atom, int], after: dict[Atom, int], dt_s: float) -> float | None:
    """The counters' growth per second over the atoms in both samples (None: none is)."""
    common = [a for a in after if a in before]
    if not common or dt_s <= 0:
        return None
    return sum(max(0, after[a] - before[a]) for a in common) / dt_s


class RateSampler:
    """Samples the brokers into `series`; `rate(topic)` is the latest produce rate."""

    def __init__(self, sources: Sources, interval_ms: int, max_points: int = 360,
                 max_series: int = 1000) -> None:
        self.sources = sources
        self.interval_ms = interval_ms
        self.series = SeriesStore(max_points, max_series)
        self._previous: tuple[float, Counters] | None = None
        self._delivered: Delivered = {}
        self._members: set[str] = set()   # the members whose stats the last round read
        self._latest_s: float | None = None

    def sample(self, at_s: float, brokers: list[BrokerView]) -> None:
        """One round: the brokers' stats as read at `at_s` (seconds since the epoch)."""
        now = counters(brokers)
        if self._previous is not None:
            t0, before = self._previous
            for key, atoms in now.items():
                rate = growth_per_s(before.get(key, {}), atoms, at_s - t0)
                if rate is not None:
                    self.series.add(key, at_s, round(rate, 3))
        for key, value in gauges(brokers).items():
            self.series.add(key, at_s, value)
        delivered = delivery_totals(brokers)
        for key, totals in delivered.items():
            mean = mean_growth(self._delivered.get(key, {}), totals, self._members)
            if mean is not None:
                self.series.add(key, at_s, round(mean, 1))
        self._delivered = delivered
        self._members = {member_name(b) for b in brokers if b.stats is not None}
        self._previous = (at_s, now)
        self._latest_s = at_s

    def rate(self, topic: str) -> float | None:
        """Messages per second stored to `topic` at the last round (None: not known)."""
        point = self.series.latest(SeriesKey("topic.produce_rate", topic))
        if point is None or point[0] != self._latest_s:
            return None
        return point[1]

    async def run(self) -> None:
        while True:
            try:
                brokers = await self.sources.brokers()
                self.sample(time.time(), brokers)
            except asyncio.CancelledError:
                raise
            except Exception as exc:   # namesrv down: try again next round
                log.info("rate sample failed: %s", exc)
            await asyncio.sleep(self.interval_ms / 1000)
