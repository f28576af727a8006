"""Asking the mesh (namesrv and brokers) for a topic's queues and their bounds, at planning.

Runs on the driver (in Spark's planning worker) under `asyncio.run`: for a
`topicPattern` the namesrv's topic list, then one namesrv route lookup per
topic, then GET_MIN_MAX (and OFFSET_FOR_TIME for reads by time) per queue. An unknown topic raises TopicNotFoundError, an unreachable namesrv
ConnectionLostError, each with a message naming what was asked.
"""
from __future__ import annotations

import asyncio
import re

from ferry.auth.credentials import Credentials
from ferry.client.core.connection import ConnectionPool
from ferry.client.core.message import TopicQueue
from ferry.client.core.namesrv import NamesrvClient, RouteCache
from ferry.client.core.offsets import queue_bounds, read_addr
from ferry.errors import ConnectionLostError, RequestTimeoutError, TopicNotFoundError
from ferry.wire import RequestCode

from ferry_spark.source.ranges import QueueBounds


class MeshProbe:
    """Routes and queue bounds of topics, over one namesrv client and connection pool."""

    def __init__(self, namesrv: str, request_timeout_ms: int,
                 credentials: Credentials | None = None) -> None:
        """`credentials` sign every namesrv and broker request (None: unsigned)."""
        self.namesrv = namesrv
        self._client = NamesrvClient(namesrv, credentials=credentials)
        self.routes = RouteCache(self._client, refresh_interval_ms=0)
        self.pool = ConnectionPool(request_timeout_ms=request_timeout_ms,
                                   credentials=credentials)

    async def close(self) -> None:
        await self.pool.close()
        await self._client.close()

    async def queues(self, topic: str) -> list[TopicQueue]:
        """Every readable queue of `topic`; clear errors for an unknown topic or namesrv."""
        try:
            route = await self.routes.route(topic)
        except TopicNotFoundError:
            raise TopicNotFoundError(f"ferry source: topic {topic!r} does not exist "
                                     f"(namesrv {self.namesrv})") from None
        except (ConnectionLostError, RequestTimeoutError) as exc:
            raise type(exc)(f"ferry source: cannot reach namesrv {self.namesrv}: {exc}") from None
        queues = [TopicQueue(topic, b, q) for b, q in route.readable_queues()]
        if not queues:
            raise TopicNotFoundError(f"ferry source: topic {topic!r} has no readable queue "
                                     f"(no live broker serves it; namesrv {self.namesrv})")
        return queues

    async def matching(self, pattern: str) -> list[str]:
        """The user topics whose whole name matches `pattern` (Kafka's subscribePattern;
        internal `%...%` topics never match), sorted."""
        try:
            data = await self._client.call("GET", "/v1/topics")
        except (ConnectionLostError, RequestTimeoutError) as exc:
            raise type(exc)(f"ferry source: cannot reach namesrv {self.namesrv}: {exc}") from None
        regex = re.compile(pattern)
        names = (str(t["name"]) for t in data.get("topics", []))
        return sorted(n for n in names if not n.startswith("%") and regex.fullmatch(n))

    async def bounds(self, tq: TopicQueue, start_ts_ms: int | None = None,
                     end_ts_ms: int | None = None) -> QueueBounds:
        low, high = await queue_bounds(self.pool, self.routes, tq)
        return QueueBounds(tq.topic, tq.broker, tq.queue_id, low, high,
                           await self._at_time(tq, start_ts_ms),
                           await self._at_time(tq, end_ts_ms))

    async def _at_time(self, tq: TopicQueue, ts_ms: int | None) -> int | None:
        if ts_ms is None:
            return None
        addr = await read_addr(self.routes, tq)
        resp = await self.pool.request(addr, RequestCode.OFFSET_FOR_TIME, {
            "topic": tq.topic, "queue_id": tq.queue_id, "ts_ms": int(ts_ms)})
        return int(resp.fields["offset"])


async def _topic_bounds(namesrv: str, topics: tuple[str, ...], pattern: str | None,
                        start_ts_ms: int | None, end_ts_ms: int | None, request_timeout_ms: int,
                        credentials: Credentials | None) -> list[QueueBounds]:
    probe = MeshProbe(namesrv, request_timeout_ms, credentials)
    try:
        queues = []
        if pattern is None:
            for topic in topics:
                queues += await probe.queues(topic)
        else:
            for topic in await probe.matching(pattern):
                try:
                    queues += await probe.queues(topic)
                except TopicNotFoundError:
                    continue   # deleted since it was listed, or no live broker serves it
        return list(await asyncio.gather(*(probe.bounds(tq, start_ts_ms, end_ts_ms)
                                           for tq in queues)))
    finally:
        await probe.close()


def topic_bounds(namesrv: str, topics: tuple[str, ...], pattern: str | None = None, *,
                 start_ts_ms: int | None = None, end_ts_ms: int | None = None,
                 request_timeout_ms: int = 30_000,
                 credentials: Credentials | None = None) -> list[QueueBounds]:
    """The bounds of every readable queue of `topics`, or of the topics matching
    `pattern`, from the mesh (blocking)."""
    return asyncio.run(_topic_bounds(namesrv, topics, pattern, start_ts_ms, end_ts_ms,
                                     request_timeout_ms, credentials))
