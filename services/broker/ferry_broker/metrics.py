"""The broker's metrics at GET /metrics: read at scrape time from what /v1/stats reads.

Nothing here runs on the put or pull path: every instrument is observable,
its callback reads the store's offsets, the committed offsets, the long-poll
holds and the counters the broker keeps anyway (the delivery totals are
kept for /v1/stats too, delivery_latency.py). Per topic, the messages
stored are the sum of the queues' max offsets (a queue's next offset: it only
grows, retention does not lower it), so `rate()` over it is the produce rate;
per group and topic the committed offsets sum to the messages consumed (the
consume rate) and `max - committed` is the lag, also of a group whose
consumers are all stopped. See docs/metrics.md for the names.
"""
from __future__ import annotations

import shutil
from collections import defaultdict
from typing import Any

from ferry.service.http import auth_refusals
from ferry.service.metrics import GROUP, TOPIC, Metrics, Reading, single

from ferry_broker.context import BrokerContext


def _per_topic(ctx: BrokerContext) -> Reading:
    store = ctx.store
    return [(sum(store.max_offset(topic, q) for q in queues), {TOPIC: topic})
            for topic, queues in store.topic_queues().items()]


def _per_group(ctx: BrokerContext, lag: bool) -> Reading:
    totals: dict[tuple[str, str], int] = defaultdict(int)
    for (group, topic, q), committed in ctx.offsets.items():
        totals[group, topic] += max(0, ctx.store.max_offset(topic, q) - committed) if lag \
            else committed
    return [(n, {GROUP: group, TOPIC: topic}) for (group, topic), n in totals.items()]


def _replication_lag(ctx: BrokerContext) -> Reading:
    status = ctx.roles.status()
    slaves = status.get("slaves") or []
    readings: list[tuple[float, dict[str, Any]]] = [
        (s["lag_bytes"], {"role": "master", "slave": str(s["broker_id"])}) for s in slaves]
    follower = status.get("follower")
    if follower is not None:
        readings.append((follower["lag_bytes"], {"role": "slave"}))
    return readings


def _disk_used_ratio(ctx: BrokerContext) -> Reading:
    disk = shutil.disk_usage(ctx.config.data_path)
    return single(disk.used / disk.total if disk.total else 0.0)


def _transactions(ctx: BrokerContext) -> Reading:
    t = ctx.txn_stats
    return [(t.halves_stored, {"event": "half_stored"}),
            (t.ended["committed"], {"event": "committed"}),
            (t.ended["rolled_back"], {"event": "rolled_back"}),
            *((n, {"event": f"check_{kind}"}) for kind, n in t.checks.items())]


def _flush_lag(ctx: BrokerContext) -> Reading:
    return single(max(0, ctx.store.commit_log_max_offset - ctx.store.flushed_offset))


def register(metrics: Metrics, ctx: BrokerContext) -> None:
    """The broker's instruments on its app's `metrics` (reading `ctx` only at scrape time)."""
    metrics.observe("ferry.broker.topic.messages", "counter", "{message}",
                    "Messages stored per topic (sum of its queues' max offsets)",
                    lambda: _per_topic(ctx))
    metrics.observe("ferry.broker.group.committed", "counter", "{message}",
                    "Messages consumed per group and topic (sum of committed offsets)",
                    lambda: _per_group(ctx, lag=False))
    metrics.observe("ferry.broker.group.lag", "gauge", "{message}",
                    "Messages stored but not yet committed, per group and topic",
                    lambda: _per_group(ctx, lag=True))
    metrics.observe("ferry.broker.group.delivered", "counter", "{message}",
                    "Messages handed to a group's members by PULL answers, per group and topic",
                    lambda: [(n, {GROUP: g, TOPIC: t}) for g, t, n, _ in ctx.delivery.items()])
    metrics.observe("ferry.broker.group.delivery_latency", "counter", "s",
                    "Sum of the delivered messages' ages (delivery minus store time): divided "
                    "by the delivered count, the mean end-to-end latency",
                    lambda: [(s / 1000, {GROUP: g, TOPIC: t})
                             for g, t, _, s in ctx.delivery.items()])
    metrics.observe("ferry.broker.store.size", "gauge", "By",
                    "Bytes held in the commit log (max - min offset)",
                    lambda: single(ctx.store.commit_log_max_offset - ctx.store.commit_log_min_offset))
    metrics.observe("ferry.broker.store.written", "counter", "By",
                    "Bytes written to the commit log since it was created (its max offset)",
                    lambda: single(ctx.store.commit_log_max_offset))
    metrics.observe("ferry.broker.flush.lag", "gauge", "By",
                    "Bytes written but not yet flushed to disk",
                    lambda: _flush_lag(ctx))
    metrics.observe("ferry.broker.disk.used_ratio", "gauge", "1",
                    "Used share of the data directory's disk (0..1)",
                    lambda: _disk_used_ratio(ctx))
    metrics.observe("ferry.broker.replication.lag", "gauge", "By",
                    "Bytes a slave is behind its master (per slave on a master)",
                    lambda: _replication_lag(ctx))
    metrics.observe("ferry.broker.long_poll.held", "gauge", "{request}",
                    "Pull requests held waiting for messages", lambda: single(ctx.long_poll.held))
    metrics.observe("ferry.broker.transactions", "counter", "{event}",
                    "Transaction events: halves stored, committed, rolled back, check-backs",
                    lambda: _transactions(ctx))
    metrics.observe("ferry.broker.consumers", "gauge", "{consumer}",
                    "Live consumers per group",
                    lambda: [(len(infos), {GROUP: g})
                             for g, infos in ctx.consumers.groups().items()])
    if ctx.auth is not None:
        auth = ctx.auth
        metrics.observe("ferry.auth.refused", "counter", "{request}",
                        "Requests refused by the auth, per transport and reason",
                        lambda: auth_refusals(auth.stats(), "wire"))
