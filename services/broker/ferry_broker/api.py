"""The broker's HTTP API: health, readiness, statistics and its OpenAPI document.

- `GET /healthz`: 200 while the process serves HTTP at all.
- `GET /readyz`: 200 once the store is open, the wire port listens and the
  broker is registered in etcd (when it uses etcd); 503 before that and
  while stopping.
- `GET /v1/stats`: per topic and queue the min/max offsets; per group, topic
  and queue the committed offset and the lag (max offset - committed); the
  live consumers (`consumers`: ids per group; `members`: per group each live
  member's topics, mode, join time and subscriptions, for the console) and the
  held pulls; the store's health (whether it takes
  writes, commit-log min/max and flushed offsets, disk used ratio); the
  transactions since start (halves stored, committed, rolled back, checks
  forwarded) and the live transactional producers per group; the groups
  whose members subscribe differently to a topic (`subscription_conflicts`)
  and the number of queue locks held; `replication`: mode, role, epoch,
  commit-log end, and the slaves with their acknowledged offset and lag
  (master) or the follower's link (slave) — see docs/replication.md;
  `limits`: the wire limits, what is in use and how often each refused
  (limits.py), and `http_limits` the same for this HTTP API; `disk`: the disk
  alarm (disk.py: whether writes are refused, used ratio, water marks).
- `GET /metrics`: the same for Prometheus (metrics.py; admin read with auth on).
"""
from __future__ import annotations

import logging
import shutil
from collections.abc import Callable
from typing import Any

from aiohttp import web
from ferry.errors import BusyError
from ferry.service.auth import HttpAuth
from ferry.service.errors import error_middleware
from ferry.service.http import METRICS, service_app
from ferry.service.limits import HttpGuard, HttpLimits
from ferry.service.openapi import document, stats_path

from ferry_broker import metrics
from ferry_broker.consumers import ConsumerInfo
from ferry_broker.context import BrokerContext
from ferry_broker.permissions import HTTP_ROUTES
from ferry_broker.subscription_conflicts import as_json

log = logging.getLogger(__name__)
errors_and_logs = error_middleware([(BusyError, 503)], log, "broker")

OPENAPI: dict[str, Any] = document(
    "ferry-broker", "1", "Health and statistics of one Ferry broker. Messages travel over the "
    "Ferry wire protocol, not over HTTP.",
    stats_path("Queue offsets, committed offsets and lag, transactions and their producers"),
    ready="Store open, wire port listening, registered in etcd (when it uses etcd)")


def member_json(info: ConsumerInfo) -> dict[str, Any]:
    """One live consumer as /v1/stats shows it (subscriptions None: the client sent none)."""
    subs = None if info.subscriptions is None else \
        {topic: as_json(fields) for topic, fields in sorted(info.subscriptions.items())}
    return {"client_id": info.client_id, "topics": sorted(info.topics), "mode": info.mode,
            "joined_ms": info.joined_ms, "subscriptions": subs}


def stats(ctx: BrokerContext) -> dict[str, Any]:
    """The statistics document of /v1/stats."""
    store = ctx.store
    topics: dict[str, dict[str, dict[str, int]]] = {}
    for topic, queue_ids in sorted(store.topic_queues().items()):
        topics[topic] = {
            str(q): {"min_offset": store.min_offset(topic, q), "max_offset": store.max_offset(topic, q)}
            for q in sorted(queue_ids)
        }
    groups: dict[str, dict[str, dict[str, dict[str, int]]]] = {}
    for (group, topic, q), committed in ctx.offsets.items():
        max_offset = store.max_offset(topic, q)
        groups.setdefault(group, {}).setdefault(topic, {})[str(q)] = {
            "committed_offset": committed, "max_offset": max_offset,
            "lag": max(0, max_offset - committed),
        }
    live = ctx.consumers.groups()
    consumers = {g: [i.client_id for i in infos] for g, infos in live.items()}
    members = {g: [member_json(i) for i in infos] for g, infos in live.items()}
    disk = shutil.disk_usage(ctx.config.data_path)
    store_health = {"healthy": ctx.health.healthy,
                    "commit_log_min_offset": store.commit_log_min_offset,
                    "commit_log_max_offset": store.commit_log_max_offset,
                    "flushed_offset": store.flushed_offset,
                    "disk_used_ratio": round(disk.used / disk.total, 4) if disk.total else 0.0}
    return {"broker": {"cluster": ctx.config.cluster, "name": ctx.config.name,
                       "id": ctx.config.id, "addr": ctx.config.addr,
                       "flush_mode": ctx.config.flush_mode},
            "store": store_health, "topics": topics, "groups": groups, "consumers": consumers,
            "members": members, "delivery": ctx.delivery.as_json(),
            "served_topics": ctx.topics.served(), "held_pulls": ctx.long_poll.held,
            "expired": dict(sorted(ctx.expiry.expired.items())),
            "subscription_conflicts": ctx.consumers.conflicts.as_json(),
            "filters": ctx.filters.as_json(),
            "locks": len(ctx.locks),
            "transactions": {**ctx.txn_stats.as_dict(), "producers": ctx.producers.groups()},
            "replication": ctx.roles.status(), "limits": ctx.limits.as_json(),
            "auth": ctx.auth.stats() if ctx.auth is not None else {"enabled": False},
            "disk": ctx.disk.as_json(),
            "histories": {**ctx.histories.as_dict(),
                          "boundaries": [[h, s] for h, s in store.history_boundaries()]}}


def build_app(ctx: BrokerContext, is_ready: Callable[[], bool],
              guard: HttpGuard | None = None) -> web.Application:
    """The broker's HTTP app: the kit's probes, /v1/stats (its HTTP limits under
    `http_limits`: `limits` are the wire's) and /openapi.json; with auth on (FERRY_AUTH=on)
    /v1/stats needs admin read (a signed request, checked against the wire's identities)."""
    auth = None
    if ctx.auth is not None:
        auth = HttpAuth(ctx.auth.registry.signing_key, ctx.auth.registry.allows,
                        HTTP_ROUTES, ctx.auth.guard, service="broker")
    app = service_app(guard or HttpGuard(HttpLimits()), errors_and_logs, OPENAPI,
                      ready=is_ready, not_ready="not ready: starting, not registered, store "
                      "failed or stopping", stats=lambda: stats(ctx), limits_key="http_limits",
                      auth=auth)
    metrics.register(app[METRICS], ctx)
    return app
