"""One PULL, and reading a queue's records between two offsets (no long polling).

`pull` sends one PullRequest and parses its answer. `read_range` is what the
read-only tools run (the DLQ listing, the time queries of the admin and of
the dedup reconciliation): PULL from `start` until `end`, under a group that
never commits, each answer's records below `end` handed out in offset order.
It stops early when an answer does not move forward (the queue ends before
`end`, or its start moved past it); it never waits.
"""
from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

from ferry.client.core.connection import ConnectionPool
from ferry.client.core.message import ConsumerRecord, TopicQueue
from ferry.client.core.namesrv import RouteCache
from ferry.client.core.offsets import read_addr
from ferry.client.core.records import decode_pull_body
from ferry.wire import RequestCode
from ferry.wire.pull import MAX_PULL_COUNT, PullAnswer, PullRequest

#: Where a range read sends its PULLs (`offsets.read_addr`, `offsets.broker_addr`).
Locate = Callable[[RouteCache, TopicQueue], Awaitable[str]]


async def pull(pool: ConnectionPool, addr: str, request: PullRequest, *,
               timeout_ms: int | None = None) -> PullAnswer:
    """Send one PULL to `addr`; its answer."""
    resp = await pool.request(addr, RequestCode.PULL, request.fields(), timeout_ms=timeout_ms)
    return PullAnswer.parse(resp.fields, resp.body, request.offset)


async def read_range(pool: ConnectionPool, routes: RouteCache, group: str, tq: TopicQueue,
                     start: int, end: int, *, batch: int = MAX_PULL_COUNT,
                     locate: Locate = read_addr) -> AsyncIterator[list[ConsumerRecord]]:
    """The records of `tq` in [start, end), an answer at a time; `locate` names the broker
    to ask (looked up again before each PULL, so a failover is followed): the master,
    else a slave, by default."""
    offset = start
    while offset < end:
        addr = await locate(routes, tq)
        answer = await pull(pool, addr, PullRequest(group, tq.topic, tq.queue_id, offset,
                                                    min(batch, end - offset)))
        if answer.found:
            records = decode_pull_body(answer.body, tq.topic, tq.broker)
            if records and records[-1].queue_offset >= end:
                records = [r for r in records if r.queue_offset < end]
            yield records
        if answer.next_offset <= offset:
            return
        offset = answer.next_offset
