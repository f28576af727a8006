"""Admin: topics and groups through namesrv, queue offsets and group lag from the brokers."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from ferry.auth.credentials import Credentials
from ferry.client.admin.dlq import DeadLetterQueue
from ferry.client.admin.offset_reset import (
    OffsetResetter,
    ResetPlan,
    ResetSpec,
    live_members,
)
from ferry.client.admin.query import (
    MAX_KEY_COUNT,
    MAX_TIME_COUNT,
    QueryResult,
    by_time,
    query_by_id,
)
from ferry.client.admin.query import query_by_key as _query_by_key
from ferry.client.core.base import AsyncClient
from ferry.client.core.connection import ConnectionPool
from ferry.client.core.message import TopicQueue
from ferry.client.core.namesrv import NamesrvClient, RouteCache, default_namesrv
from ferry.client.core.offsets import broker_addr, queue_bounds
from ferry.errors import FerryError, TopicNotFoundError
from ferry.names import validate_group, validate_topic
from ferry.wire import RequestCode


@dataclass(frozen=True, slots=True)
class QueueInfo:
    """One queue's range: `min_offset` is the oldest kept, `max_offset` the next to write."""

    tq: TopicQueue
    min_offset: int
    max_offset: int


@dataclass(frozen=True, slots=True)
class QueueLag:
    """How far a group is behind on one queue (`committed` is -1 when it never committed)."""

    tq: TopicQueue
    committed: int
    max_offset: int

    @property
    def lag(self) -> int:
        return self.max_offset - max(self.committed, 0)


class Admin(AsyncClient):
    """Administrative calls. Use `async with Admin(namesrv=...) as admin:`."""

    def __init__(self, *, namesrv: str | None = None, request_timeout_ms: int = 10_000,
                 credentials: Credentials | None = None) -> None:
        """`credentials` sign every request (default: FERRY_ACCESS_KEY/FERRY_SECRET_KEY,
        unsigned when those are unset)."""
        self.credentials = credentials if credentials is not None else Credentials.from_env()
        self._namesrv = NamesrvClient(namesrv or default_namesrv(), credentials=self.credentials)
        self._routes = RouteCache(self._namesrv, refresh_interval_ms=0)
        self._pool = ConnectionPool(request_timeout_ms=request_timeout_ms,
                                    credentials=self.credentials)

    async def start(self) -> None:
        await self._namesrv.start()

    async def stop(self) -> None:
        await self._pool.close()
        await self._namesrv.close()

    # -- topics ------------------------------------------------------------------------------
    async def create_topic(self, name: str, *, queues: int = 8, perm: str = "rw",
                           type: str = "normal", brokers: Sequence[str] = (),
                           priority_levels: int = 1, retention_ms: int | None = None,
                           retention_bytes: int | None = None) -> dict[str, Any]:
        """Create a topic (AlreadyExistsError if it exists); returns its config.

        `priority_levels` (1..4, at most `queues`): see `Producer.send(priority=)`.
        `retention_ms`, `retention_bytes` (per queue): the topic's own retention
        (None: the broker's; docs/broker.md, "Per-topic retention").
        """
        body = {"name": validate_topic(name), "queues": queues, "perm": perm, "type": type,
                "brokers": list(brokers), "priority_levels": priority_levels}
        # Only when set: a namesrv from before per-topic retention refuses unknown fields.
        body.update({k: v for k, v in (("retention_ms", retention_ms),
                                       ("retention_bytes", retention_bytes)) if v is not None})
        return await self._namesrv.call("POST", "/v1/topics", json=body)  # type: ignore[no-any-return]

    async def update_topic(self, name: str, **changes: Any) -> dict[str, Any]:
        """Change some fields of an existing topic's config (TopicNotFoundError if none).

        `changes` are TopicConfig fields (`queues`, `perm`, `retention_ms`,
        `retention_bytes`, ...); the others keep their values, and None sets a
        retention back to the broker's. Returns the new config.
        """
        current = await self._namesrv.call("GET", f"/v1/topics/{validate_topic(name)}")
        body = {**current, **changes, "name": name}
        return await self._namesrv.call("PUT", f"/v1/topics/{name}", json=body)  # type: ignore[no-any-return]

    async def delete_topic(self, name: str) -> None:
        await self._namesrv.call("DELETE", f"/v1/topics/{validate_topic(name)}")

    async def list_topics(self) -> list[dict[str, Any]]:
        data = await self._namesrv.call("GET", "/v1/topics")
        return list(data.get("topics", []))

    async def describe_topic(self, name: str) -> dict[str, Any]:
        """Config, route, and each queue's min/max offset (None where a broker is down)."""
        validate_topic(name, allow_internal=True)
        try:
            config = await self._namesrv.call("GET", f"/v1/topics/{name}")
        except TopicNotFoundError:
            config = None
        route = await self._namesrv.get_route(name)
        queues = []
        for broker, qid in route.readable_queues():
            tq = TopicQueue(name, broker, qid)
            try:
                low, high = await self._min_max(tq)
            except FerryError as exc:
                queues.append({"broker": broker, "queue_id": qid, "error": str(exc)})
                continue
            queues.append({"broker": broker, "queue_id": qid, "min_offset": low,
                           "max_offset": high})
        return {"name": name, "config": config, "type": route.type, "perm": route.perm,
                "priority_levels": route.priority_levels,
                "brokers": [{"name": b.name, "master": b.master, "queues": b.queues,
                             "perm": b.perm} for b in route.brokers],
                "queues": queues}

    async def queue_infos(self, topic: str) -> list[QueueInfo]:
        route = await self._routes.route(topic)
        out = []
        for broker, qid in route.readable_queues():
            tq = TopicQueue(topic, broker, qid)
            low, high = await self._min_max(tq)
            out.append(QueueInfo(tq, low, high))
        return out

    # -- groups ------------------------------------------------------------------------------
    async def create_group(self, name: str, **config: Any) -> dict[str, Any]:
        body = {"name": validate_group(name), **config}
        return await self._namesrv.call("POST", "/v1/groups", json=body)  # type: ignore[no-any-return]

    async def describe_group(self, name: str) -> dict[str, Any]:
        """The group's config (GroupNotFoundError when it has none)."""
        return await self._namesrv.call("GET", f"/v1/groups/{validate_group(name)}")  # type: ignore[no-any-return]

    async def delete_group(self, name: str) -> None:
        """Delete the group's config (its committed offsets stay at the brokers)."""
        await self._namesrv.call("DELETE", f"/v1/groups/{validate_group(name)}")

    async def group_members(self, group: str, topic: str) -> list[str]:
        """Client ids of `group`'s live members on the masters of `topic`."""
        return await live_members(self._pool, self._routes, validate_group(group),
                                  validate_topic(topic))

    async def reset_offsets(self, group: str, topic: str, spec: ResetSpec, *,
                            dry_run: bool = False, force: bool = False) -> ResetPlan:
        """Move `group`'s committed offsets on every queue of `topic` (see
        `ferry.client.admin.offset_reset`); with `dry_run` only the plan. BusyError
        while the group has live members, unless `force`."""
        resetter = OffsetResetter(self._pool, self._routes, validate_group(group),
                                  validate_topic(topic))
        plan = await resetter.run(spec, dry_run=dry_run, force=force)
        if not plan.executed:
            return plan
        try:   # the offsets moved already: a failed record is reported, not raised
            await self._namesrv.call("POST", f"/v1/groups/{group}/resets", json=plan.to_dict())
        except FerryError as exc:
            return replace(plan, unrecorded=f"{type(exc).__name__}: {exc}")
        return plan

    async def offset_resets(self, group: str) -> list[dict[str, Any]]:
        """The group's recorded offset resets (who, when, each queue's from/to), newest
        first."""
        data = await self._namesrv.call("GET", f"/v1/groups/{validate_group(group)}/resets")
        return list(data.get("resets", []))

    async def list_groups(self) -> list[dict[str, Any]]:
        data = await self._namesrv.call("GET", "/v1/groups")
        return list(data.get("groups", []))

    async def group_lag(self, group: str, topics: Sequence[str] | None = None) -> list[QueueLag]:
        """Per queue: the group's committed offset and the queue's max offset.

        With no `topics`, every user topic is checked and queues the group never
        committed on are left out.
        """
        validate_group(group)
        explicit = topics is not None
        names = list(topics) if topics is not None else \
            [t["name"] for t in await self.list_topics()]
        out = []
        for topic in names:
            for info in await self.queue_infos(topic):
                committed = await self._committed(group, info.tq)
                if committed < 0 and not explicit:
                    continue
                out.append(QueueLag(info.tq, committed, info.max_offset))
        return out

    def dead_letters(self, group: str) -> DeadLetterQueue:
        """The group's dead-letter queue: list, resend, purge (see `ferry.client.admin.dlq`)."""
        return DeadLetterQueue(self._pool, self._routes, validate_group(group))

    # -- message queries (see ferry.client.admin.query) ---------------------------------------------
    async def query_message(self, msg_id: str) -> QueryResult:
        """A message by id from every broker, in any topic (internal ones too: `%SCHEDULE%`,
        `%RETRY%<group>`, `%DLQ%<group>`, ...): each broker's newest record of it, oldest first."""
        return await query_by_id(self._pool, self._namesrv, msg_id)

    async def query_by_key(self, topic: str, key: str, *, begin_ms: int = 0,
                           end_ms: int | None = None,
                           max_count: int = MAX_KEY_COUNT) -> QueryResult:
        """Messages of `topic` stored with `key` (from the brokers' key index), newest first."""
        return await _query_by_key(self._pool, self._routes, topic, key, begin_ms=begin_ms,
                                   end_ms=end_ms, max_count=max_count)

    async def messages_by_time(self, topic: str, begin_ms: int, end_ms: int, *,
                               max_count: int = MAX_TIME_COUNT) -> QueryResult:
        """Messages of `topic` stored in [begin_ms, end_ms), oldest first (read-only)."""
        return await by_time(self._pool, self._routes, topic, begin_ms, end_ms,
                             max_count=max_count)

    # -- wire calls --------------------------------------------------------------------------
    async def _min_max(self, tq: TopicQueue) -> tuple[int, int]:
        return await queue_bounds(self._pool, self._routes, tq)

    async def _committed(self, group: str, tq: TopicQueue) -> int:
        addr = await broker_addr(self._routes, tq)
        resp = await self._pool.request(addr, RequestCode.QUERY_OFFSET,
                                        {"group": group, "topic": tq.topic,
                                         "queue_id": tq.queue_id})
        return int(resp.fields.get("offset", -1))
