"""Which queues each member of a consumer group owns, and the heartbeats that define members.

Allocation is one of the strategies of `allocation` ("average", RocketMQ's
"averagely", by default; or "consistent_hash"), computed by every member on its
own from the same inputs: the topic's queues and the group's members, in join
order (each member's start time, `joined_ms`, travels in its heartbeats and
comes back with GET_CONSUMERS). Every
member computing it from the same inputs gets a disjoint cover of all queues,
so no coordinator is needed. Members are
what the brokers know from heartbeats (a member missing heartbeats for 30 s is
dropped by the broker, one that stops sends UNREGISTER at once).
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any

from ferry.client.consuming.allocation import Allocator, allocate_all, allocate_averagely
from ferry.client.core.connection import ConnectionPool
from ferry.client.core.message import TopicQueue
from ferry.client.core.namesrv import RouteCache, TopicRoute
from ferry.errors import BroadcastNotAllowedError, FerryError
from ferry.wire import RequestCode

log = logging.getLogger(__name__)

__all__ = ["GroupMembership", "allocate_all", "allocate_averagely", "broadcasting_assignment",
           "periodically"]


class GroupMembership:
    """Heartbeats of one consumer to the brokers, and the group's members per topic."""

    def __init__(self, pool: ConnectionPool, routes: RouteCache, *, client_id: str, group: str,
                 topics: Sequence[str], mode: str,
                 allocate: Allocator = allocate_averagely,
                 subscriptions: Mapping[str, Mapping[str, Any]] | None = None) -> None:
        self.pool = pool
        self.routes = routes
        self.client_id = client_id
        self.group = group
        self.topics = list(topics)
        self.mode = mode
        self.allocate = allocate
        # topic -> {"tags", "sql"} for HEARTBEAT; topics missing take every message
        self.subscriptions = dict(subscriptions or {})
        #: When this member started (epoch ms), set by the consumer before its first
        #: heartbeat: the brokers report it so that members agree on the join order.
        self.joined_ms = 0

    async def known_routes(self) -> dict[str, TopicRoute]:
        """The routes of the subscribed topics that exist now (missing topics are skipped)."""
        out: dict[str, TopicRoute] = {}
        for topic in self.topics:
            try:
                out[topic] = await self.routes.route(topic)
            except FerryError as exc:
                log.debug("no route for %s yet: %s", topic, exc)
        return out

    def broker_addrs(self, routes: Iterable[TopicRoute]) -> list[str]:
        return sorted({b.master for r in routes for b in r.brokers if b.master})

    async def heartbeat(self, routes: Iterable[TopicRoute]) -> None:
        """HEARTBEAT to every broker serving a subscribed topic; failures are logged, but
        a group that refuses this member's mode (BroadcastNotAllowedError) raises: that is
        no transient failure, and `Consumer.start` must not pretend to have joined."""
        # `subscriptions` is sent even when empty (every topic takes everything): the broker
        # compares members' filters only when each member said what it takes.
        fields = {"client_id": self.client_id, "group": self.group, "topics": self.topics,
                  "mode": self.mode, "subscriptions": self.subscriptions,
                  "joined_ms": self.joined_ms}
        for addr in self.broker_addrs(routes):
            try:
                await self.pool.request(addr, RequestCode.HEARTBEAT, fields)
            except BroadcastNotAllowedError:
                raise
            except FerryError as exc:
                log.info("heartbeat to %s failed: %s", addr, exc)

    async def unregister(self, routes: Iterable[TopicRoute]) -> None:
        fields = {"client_id": self.client_id, "group": self.group}
        for addr in self.broker_addrs(routes):
            try:
                await self.pool.request(addr, RequestCode.UNREGISTER, fields)
            except FerryError as exc:
                log.info("unregister at %s failed: %s", addr, exc)

    async def members(self, route: TopicRoute) -> list[str]:
        """The group's members on this topic in join order: the union of what its brokers report.

        Ordered by (joined_ms, client id): every member gets the same order from the
        same answers (consistent_hash depends on it; average sorts the ids itself). A
        member a broker reports without joined_ms (an older broker or client) counts 0,
        and the largest value any broker reports wins, so one old broker does not
        reorder the group.
        """
        joined: dict[str, int] = {}
        answered = False
        for b in route.brokers:
            if not b.master:
                continue
            try:
                resp = await self.pool.request(
                    b.master, RequestCode.GET_CONSUMERS, {"group": self.group, "topic": route.topic})
            except FerryError as exc:
                log.info("GET_CONSUMERS at %s failed: %s", b.master, exc)
                continue
            answered = True
            for cid, ms in _joined(resp.fields):
                joined[cid] = max(ms, joined.get(cid, 0))
        if answered:  # our own heartbeat may not have reached a broker yet
            joined[self.client_id] = self.joined_ms
        return sorted(joined, key=lambda cid: (joined[cid], cid))

    async def clustering_assignment(
            self, routes: dict[str, TopicRoute]) -> dict[str, set[TopicQueue] | None]:
        """The queues this member owns per topic; None where no broker answered (keep as is)."""
        owned: dict[str, set[TopicQueue] | None] = {}
        for topic, route in routes.items():
            members = await self.members(route)
            if not members:
                owned[topic] = None
                continue
            queues = [TopicQueue(topic, b, q) for b, q in route.readable_queues()]
            owned[topic] = set(self.allocate(queues, members, self.client_id))
        return owned


def _joined(fields: Mapping[str, Any]) -> list[tuple[str, int]]:
    """(client id, joined_ms) pairs of a GET_CONSUMERS answer; 0 where none is given."""
    members = [str(m) for m in fields.get("members") or ()]
    times = fields.get("joined_ms")
    if not isinstance(times, list) or len(times) != len(members):
        times = [0] * len(members)   # an older broker: no join times
    return [(m, t if type(t) is int and t >= 0 else 0) for m, t in zip(members, times, strict=True)]


def broadcasting_assignment(routes: dict[str, TopicRoute]) -> dict[str, set[TopicQueue] | None]:
    """Every readable queue of every subscribed topic."""
    return {t: {TopicQueue(t, b, q) for b, q in r.readable_queues()} for t, r in routes.items()}


async def periodically(heartbeat_interval_ms: int, rebalance_interval_ms: int,
                       step: Callable[..., Awaitable[None]]) -> None:
    """Call `step(heartbeat=..., rebalance=...)` on each interval, for as long as it runs.

    Failures are logged and the loop goes on: without heartbeats the broker
    expires this member while its fetchers keep pulling, and two members would
    then consume the same queues.
    """
    loop = asyncio.get_running_loop()
    next_hb = loop.time() + heartbeat_interval_ms / 1000
    next_rb = loop.time() + rebalance_interval_ms / 1000
    while True:
        await asyncio.sleep(max(0.0, min(next_hb, next_rb) - loop.time()))
        now = loop.time()
        heartbeat, rebalance = now >= next_hb, now >= next_rb
        if heartbeat:
            next_hb = now + heartbeat_interval_ms / 1000
        if rebalance:
            next_rb = now + rebalance_interval_ms / 1000
        try:
            await step(heartbeat=heartbeat, rebalance=rebalance)
        except FerryError as exc:
            log.warning("rebalance failed: %s", exc)
        except Exception:
            log.exception("rebalance failed unexpectedly; retrying next round")
