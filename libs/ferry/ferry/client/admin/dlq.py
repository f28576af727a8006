"""A group's dead-letter queue `%DLQ%<group>`: list, resend, purge (the admin side).

Messages cannot be deleted from a log, so the DLQ is read from the group's
own committed offset on each `%DLQ%<group>` queue: `messages` (`ferry dlq
list`) shows what lies after it, `purge` moves it to the end (the messages stay stored until
retention removes them, but are no longer listed), and `resend` sends
messages back with SEND_BACK naming each dead letter where it is stored
(reconsume_times 0, no delay; the broker copies it with its `ORIGIN_TOPIC`),
so that they return through `%RETRY%<group>` to that group only. `resend` of every message also moves the committed offset past what it
resent; resending one id leaves the DLQ as it is.
"""
from __future__ import annotations

from collections.abc import AsyncIterator, Iterable

from ferry.client.consuming.retry import DEFAULT_MAX_RECONSUME_TIMES, send_back_fields
from ferry.client.core.connection import ConnectionPool
from ferry.client.core.message import ConsumerRecord, TopicQueue
from ferry.client.core.namesrv import RouteCache
from ferry.client.core.offsets import broker_addr, queue_bounds
from ferry.client.reading.ranges import read_range
from ferry.errors import TopicNotFoundError
from ferry.names import dlq_topic
from ferry.wire import RequestCode

#: Records asked for per PULL while scanning a DLQ queue.
SCAN_BATCH = 256


class DeadLetterQueue:
    """The dead-letter queue of one consumer group."""

    def __init__(self, pool: ConnectionPool, routes: RouteCache, group: str) -> None:
        self.pool = pool
        self.routes = routes
        self.group = group
        self.topic = dlq_topic(group)

    async def queues(self) -> list[TopicQueue]:
        """Every queue of `%DLQ%<group>` ([] when nothing was ever dead-lettered)."""
        try:
            route = await self.routes.route(self.topic)
        except TopicNotFoundError:
            return []
        return [TopicQueue(self.topic, b, q) for b, q in route.readable_queues()]

    async def committed(self, tq: TopicQueue) -> int:
        """The group's committed offset on a DLQ queue (-1: never committed)."""
        addr = await broker_addr(self.routes, tq)
        resp = await self.pool.request(addr, RequestCode.QUERY_OFFSET, {
            "group": self.group, "topic": tq.topic, "queue_id": tq.queue_id})
        return int(resp.fields.get("offset", -1))

    async def commit(self, tq: TopicQueue, offset: int) -> None:
        addr = await broker_addr(self.routes, tq)
        await self.pool.request(addr, RequestCode.COMMIT_OFFSET, {
            "group": self.group, "topic": tq.topic, "queue_id": tq.queue_id, "offset": offset})

    async def scan(self, tq: TopicQueue) -> AsyncIterator[ConsumerRecord]:
        """The records of `tq` from the group's committed offset to the end now."""
        low, high = await queue_bounds(self.pool, self.routes, tq)
        offset = max(await self.committed(tq), low)
        async for records in read_range(self.pool, self.routes, self.group, tq, offset, high,
                                        batch=SCAN_BATCH, locate=broker_addr):
            for record in records:
                yield record

    async def messages(self, limit: int | None = None) -> list[ConsumerRecord]:
        """The messages after the group's committed offsets, queue by queue.

        Each record's `ORIGIN_TOPIC` property names the topic it failed on.
        """
        out: list[ConsumerRecord] = []
        for tq in await self.queues():
            async for record in self.scan(tq):
                if limit is not None and len(out) >= limit:
                    return out
                out.append(record)
        return out

    async def resend(self, ids: Iterable[str] | None = None,
                     max_reconsume_times: int = DEFAULT_MAX_RECONSUME_TIMES) -> list[str]:
        """Send messages (these ids, or all when None) back to the group; returns their ids."""
        wanted = {i.upper() for i in ids} if ids is not None else None
        sent: list[str] = []
        for tq in await self.queues():
            end = None
            async for record in self.scan(tq):
                if wanted is None or record.msg_id in wanted:
                    await self._send_back(record, max_reconsume_times)
                    sent.append(record.msg_id)
                end = record.queue_offset + 1
            if wanted is None and end is not None:
                await self.commit(tq, end)   # resent: no longer listed
        return sent

    async def purge(self) -> int:
        """Move the group's offsets to the end of its DLQ; returns how many messages it skipped."""
        skipped = 0
        for tq in await self.queues():
            low, high = await queue_bounds(self.pool, self.routes, tq)
            skipped += high - max(await self.committed(tq), low)
            await self.commit(tq, high)
        return skipped

    async def _send_back(self, record: ConsumerRecord, max_reconsume_times: int) -> None:
        addr = await broker_addr(self.routes, record.topic_queue)
        await self.pool.request(addr, RequestCode.SEND_BACK, send_back_fields(
            record, self.group, reconsume_times=0, delay_ms=0,
            max_reconsume_times=max_reconsume_times))
