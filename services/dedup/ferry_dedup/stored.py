"""What the brokers stored in a topic during a time window: the message side of reconciliation.

For each readable queue of the topic's route (namesrv), OFFSET_FOR_TIME
gives the first offset stored at or after the window's start and the first
at or after its end; the records between are PULLed (no long polling, no
filter) and reduced to what reconciliation needs. Nothing is committed: the
read uses a group name of its own (`ferry-dedup-reconcile`) and moves no
consumer's position. A queue that cannot be read (its broker is down) is
named in `StoredWindow.errors`, and the report says it is incomplete.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field

from ferry.client.core.connection import ConnectionPool
from ferry.client.core.message import TopicQueue
from ferry.client.core.namesrv import RouteCache
from ferry.client.core.offsets import read_addr
from ferry.client.reading import read_range
from ferry.errors import FerryError, MessageNotFoundError
from ferry.idempotence import biz_key_of
from ferry.wire import RequestCode

log = logging.getLogger("ferry_dedup")

#: The group named in the reconciliation's PULLs (it commits nothing).
READ_GROUP = "ferry-dedup-reconcile"


@dataclass(frozen=True, slots=True)
class StoredEntry:
    """One stored message, reduced to what reconciliation compares with a `LedgerEntry`."""

    msg_id: str
    biz_key: str       # the message key, else the message id (`biz_key_of`)
    store_ts_ms: int
    queue: str         # "topic@broker#queue_id"
    queue_offset: int

    def to_json(self) -> dict[str, object]:
        return {"msg_id": self.msg_id, "biz_key": self.biz_key, "store_ts_ms": self.store_ts_ms,
                "queue": self.queue, "queue_offset": self.queue_offset}


@dataclass
class StoredWindow:
    """The messages of one topic stored in [from_ms, to_ms), and what could not be read."""

    messages: list[StoredEntry] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    truncated: bool = False   # max_scan_messages was reached


class StoredReader:
    """Reads a topic's stored messages by time, and single messages by id."""

    def __init__(self, pool: ConnectionPool, routes: RouteCache, *, pull_max_count: int,
                 max_messages: int) -> None:
        self.pool = pool
        self.routes = routes
        self.pull_max_count = pull_max_count
        self.max_messages = max_messages

    async def window(self, topic: str, from_ms: int, to_ms: int) -> StoredWindow:
        """Every message of `topic` stored in [from_ms, to_ms), queue by queue.

        TopicNotFoundError propagates when namesrv knows no such topic.
        """
        self.routes.invalidate(topic)   # a fresh route: queues may have been added
        route = await self.routes.route(topic)
        out = StoredWindow()
        for broker, queue_id in route.readable_queues():
            tq = TopicQueue(topic, broker, queue_id)
            try:
                await self._read_queue(tq, from_ms, to_ms, out)
            except FerryError as exc:
                log.warning("reconcile: queue %s unreadable: %s", tq, exc)
                out.errors.append(f"{tq}: {type(exc).__name__}: {exc}")
            if out.truncated:
                break
        return out

    async def _read_queue(self, tq: TopicQueue, from_ms: int, to_ms: int,
                          out: StoredWindow) -> None:
        offset = await self._offset_for_time(tq, from_ms)
        end = await self._offset_for_time(tq, to_ms)
        async for records in read_range(self.pool, self.routes, READ_GROUP, tq, offset, end,
                                        batch=self.pull_max_count):
            for record in records:
                # OFFSET_FOR_TIME bounds the range; the times are checked again
                # because a broker's clock may step back within a queue.
                if not from_ms <= record.store_ts_ms < to_ms:
                    continue
                if len(out.messages) >= self.max_messages:
                    out.truncated = True
                    return
                out.messages.append(StoredEntry(
                    record.msg_id, biz_key_of(record), record.store_ts_ms, str(tq),
                    record.queue_offset))

    async def _offset_for_time(self, tq: TopicQueue, ts_ms: int) -> int:
        addr = await read_addr(self.routes, tq)
        resp = await self.pool.request(addr, RequestCode.OFFSET_FOR_TIME, {
            "topic": tq.topic, "queue_id": tq.queue_id, "ts_ms": max(0, int(ts_ms))})
        return int(resp.fields["offset"])

    async def is_stored(self, topic: str, msg_id: str) -> bool | None:
        """Whether a broker of `topic` stores message `msg_id` (in any queue or retry topic);
        None when a broker could not be asked."""
        route = await self.routes.route(topic)
        unknown = False
        for group in route.brokers:
            addr = group.master or (group.slaves[0] if group.slaves else None)
            if addr is None:
                unknown = True
                continue
            try:
                resp = await self.pool.request(addr, RequestCode.QUERY_BY_ID,
                                               {"msg_id": msg_id})
            except MessageNotFoundError:
                continue
            except FerryError:
                unknown = True
                continue
            if int(resp.fields.get("count", 0)) > 0:
                return True
        return None if unknown else False
