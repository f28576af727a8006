"""A group's lag over time, from where the queues ended and where the group had read.

The queues' end offsets over time are exact: every stored message has its
queue offset and store time (the topic, read through the source). The group's
position over time comes from its consumers' `receive` spans (the offset each
traced first delivery had), so it is exact with every message traced and a
staircase through the sampled messages otherwise (between two samples the
position is the last one seen: lag is then an upper bound). Before the first
sample of a queue the position is the first offset read. The group's
committed offsets now (QUERY_OFFSET through `ferry.Admin`) give the last,
exact point: `lag_now`.
"""
from __future__ import annotations

import time
from collections.abc import Iterable

import pandas as pd
from ferry import Admin

from ferry_spark.jobs import common

#: Lag buckets: the smallest of these that cuts the run into at most MAX_BUCKETS.
BUCKET_CHOICES_S = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 21600, 86400)
MAX_BUCKETS = 120


def bucket_for(span_s: float) -> int:
    """A bucket width (s) that gives a readable curve for a run lasting `span_s`."""
    for width in BUCKET_CHOICES_S:
        if span_s / width <= MAX_BUCKETS:
            return width
    return BUCKET_CHOICES_S[-1]


def _queue_frame(rows: pd.DataFrame, value: str, index: pd.Index) -> pd.DataFrame:
    wide = rows.pivot_table(index="bucket_s", columns=["broker", "queue_id"], values=value,
                            aggfunc="max")
    return wide.reindex(index)


def lag_over_time(produced: pd.DataFrame, consumed: pd.DataFrame,
                  bucket_s: int) -> pd.DataFrame:
    """Rows (topic, group, ts, lag): messages stored and not yet read at each bucket's end.

    `produced`: topic, broker, queue_id, bucket_s, end_offset, first_offset
    (metrics.produced_positions); `consumed`: topic, group, broker, queue_id,
    bucket_s, position (metrics.consumed_positions).
    """
    out: list[pd.DataFrame] = []
    for (topic, group), cons in consumed.groupby(["topic", "group"]):
        prod = produced[produced["topic"] == topic]
        if prod.empty:
            continue
        index = pd.Index(sorted(set(prod["bucket_s"]) | set(cons["bucket_s"])), name="bucket_s")
        ends = _queue_frame(prod, "end_offset", index).ffill()
        base = prod.groupby(["broker", "queue_id"])["first_offset"].min()
        ends = ends.fillna(base)
        pos = _queue_frame(cons, "position", index).reindex(columns=ends.columns).ffill()
        pos = pos.fillna(base).cummax()
        lag = (ends - pos).clip(lower=0).sum(axis=1)
        ts = pd.to_datetime((index.to_numpy() + bucket_s) * 1_000_000_000)
        out.append(pd.DataFrame({"topic": topic, "group": group, "ts": ts,
                                 "lag": lag.to_numpy().astype("int64")}))
    if not out:
        return pd.DataFrame({"topic": pd.Series(dtype=str), "group": pd.Series(dtype=str),
                             "ts": pd.Series(dtype="datetime64[ns]"),
                             "lag": pd.Series(dtype="int64")})
    return pd.concat(out, ignore_index=True)


async def _lag_now(namesrv: str, pairs: Iterable[tuple[str, str]]) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    now = pd.Timestamp(time.time_ns()).floor("s")
    async with Admin(namesrv=namesrv) as admin:
        for topic, group in sorted(set(pairs)):
            queues = await admin.group_lag(group, [topic])
            committed = [q for q in queues if q.committed >= 0]
            rows.append({"topic": topic, "group": group, "ts": now,
                         "lag": sum(q.lag for q in queues),
                         "queues": len(queues), "queues_committed": len(committed)})
    return rows


def lag_now(namesrv: str, pairs: Iterable[tuple[str, str]]) -> pd.DataFrame:
    """Per (topic, group): the lag by the group's committed offsets, now."""
    rows = common.run(_lag_now(namesrv, pairs))
    cols = ["topic", "group", "ts", "lag", "queues", "queues_committed"]
    return pd.DataFrame(rows, columns=cols)
