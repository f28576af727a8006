"""Moving a consumer group's committed offsets (Kafka's `--reset-offsets`, RocketMQ's
`resetOffsetByTime`): the plan per queue, then one reset commit per queue.

The plan reads each readable queue of the topic: its bounds, the group's committed
offset (`from`, -1 when none) and the target (`to`, always within the queue's
bounds). Executing it sends COMMIT_OFFSET with `reset: true` to each queue's master;
that needs `reset` on the group (docs/security.md). Kafka's rule holds: refused
(BusyError) while the group has live members, checked on every broker of the
topic before anything is written and again by each broker; with `force` the
members are told to move (their next PULL answers OFFSET_RESET).
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from ferry.client.core.connection import ConnectionPool
from ferry.client.core.message import TopicQueue
from ferry.client.core.namesrv import RouteCache
from ferry.client.core.offsets import broker_addr, queue_bounds, read_addr
from ferry.errors import BusyError, MalformedRequestError
from ferry.wire import RequestCode


class ResetTo(enum.Enum):
    """Where a reset moves each queue."""

    EARLIEST = "earliest"   # the oldest kept message
    LATEST = "latest"       # the end: only new messages
    TIME = "time"           # the first message stored at or after `value` (ms)
    OFFSET = "offset"       # queue offset `value` on every queue
    SHIFT = "shift"         # the committed offset moved by `value` (negative: back)


@dataclass(frozen=True, slots=True)
class ResetSpec:
    """A reset target: `to`, and its number for TIME (ms), OFFSET and SHIFT."""

    to: ResetTo
    value: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"to": self.to.value, "value": self.value}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ResetSpec:
        try:
            to = ResetTo(d.get("to"))
        except ValueError:
            raise MalformedRequestError(
                f"'to' must be one of {[t.value for t in ResetTo]}, not {d.get('to')!r}"
            ) from None
        value = d.get("value", 0)
        if to is ResetTo.TIME and isinstance(value, str):
            return cls(to, parse_time_ms(value))
        if type(value) is not int:
            raise MalformedRequestError(f"'value' must be an integer, not {value!r}")
        return cls(to, value)


def parse_time_ms(text: str) -> int:
    """Milliseconds since the epoch from digits, or from an ISO 8601 time (UTC when it
    names no zone)."""
    text = text.strip()
    if text.isdigit():
        return int(text)
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise MalformedRequestError(f"not a time: {text!r} (ISO 8601 like "
                                    "2026-01-31T12:00:00Z, or milliseconds)") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return int(when.timestamp() * 1000)


@dataclass(frozen=True, slots=True)
class QueueReset:
    """One queue's line of a reset plan (`before` is -1 when the group never committed)."""

    broker: str
    queue_id: int
    before: int
    after: int

    def to_dict(self) -> dict[str, Any]:
        return {"broker": self.broker, "queue_id": self.queue_id, "from": self.before,
                "to": self.after}


@dataclass(frozen=True, slots=True)
class ResetPlan:
    """What a reset does (or did): per queue from/to, and the live members seen."""

    group: str
    topic: str
    spec: ResetSpec
    queues: list[QueueReset]
    members: list[str]
    executed: bool
    force: bool = False
    #: Why the executed reset is not in namesrv's record of resets ("" when it is).
    unrecorded: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"group": self.group, "topic": self.topic, **self.spec.to_dict(),
                "members": self.members, "executed": self.executed, "force": self.force,
                "queues": [q.to_dict() for q in self.queues]}


async def live_members(pool: ConnectionPool, routes: RouteCache, group: str,
                       topic: str) -> list[str]:
    """The group's members (client ids) heart-beating to any master of `topic`."""
    route = await routes.route(topic)
    seen: set[str] = set()
    for b in route.brokers:
        if b.master:
            resp = await pool.request(b.master, RequestCode.GET_CONSUMERS, {"group": group})
            seen.update(str(m) for m in resp.fields.get("members", []))
    return sorted(seen)


class OffsetResetter:
    """Plans and runs one group's offset reset on one topic (see the module doc)."""

    def __init__(self, pool: ConnectionPool, routes: RouteCache, group: str,
                 topic: str) -> None:
        self._pool, self._routes = pool, routes
        self.group, self.topic = group, topic

    async def run(self, spec: ResetSpec, *, dry_run: bool, force: bool) -> ResetPlan:
        members = await live_members(self._pool, self._routes, self.group, self.topic)
        queues = await self.plan(spec)
        if dry_run:
            return ResetPlan(self.group, self.topic, spec, queues, members, False)
        if members and not force:
            raise BusyError(f"group {self.group} has {len(members)} live member(s) "
                            f"({', '.join(members[:5])}): stop them first, or force the "
                            "reset (they are told to move to the new offsets)")
        done = [await self._commit(q, force) for q in queues]
        return ResetPlan(self.group, self.topic, spec, done, members, True, force)

    async def plan(self, spec: ResetSpec) -> list[QueueReset]:
        route = await self._routes.route(self.topic)
        out = []
        for broker, qid in route.readable_queues():
            tq = TopicQueue(self.topic, broker, qid)
            low, high = await queue_bounds(self._pool, self._routes, tq)
            before = await self._committed(tq)
            out.append(QueueReset(broker, qid, before,
                                  min(max(await self._target(tq, spec, low, high, before),
                                          low), high)))
        return out

    async def _target(self, tq: TopicQueue, spec: ResetSpec, low: int, high: int,
                      before: int) -> int:
        if spec.to is ResetTo.EARLIEST:
            return low
        if spec.to is ResetTo.LATEST:
            return high
        if spec.to is ResetTo.OFFSET:
            return spec.value
        if spec.to is ResetTo.SHIFT:   # from the committed offset, else from the oldest
            return (before if before >= 0 else low) + spec.value
        addr = await read_addr(self._routes, tq)
        resp = await self._pool.request(addr, RequestCode.OFFSET_FOR_TIME,
                                        {"topic": tq.topic, "queue_id": tq.queue_id,
                                         "ts_ms": max(spec.value, 0)})
        return int(resp.fields["offset"])

    async def _committed(self, tq: TopicQueue) -> int:
        addr = await read_addr(self._routes, tq)
        resp = await self._pool.request(addr, RequestCode.QUERY_OFFSET,
                                        {"group": self.group, "topic": tq.topic,
                                         "queue_id": tq.queue_id})
        return int(resp.fields.get("offset", -1))

    async def _commit(self, q: QueueReset, force: bool) -> QueueReset:
        tq = TopicQueue(self.topic, q.broker, q.queue_id)
        resp = await self._pool.request(await broker_addr(self._routes, tq),
                                        RequestCode.COMMIT_OFFSET,
                                        {"group": self.group, "topic": self.topic,
                                         "queue_id": q.queue_id, "offset": q.after,
                                         "reset": True, "force": force})
        return QueueReset(q.broker, q.queue_id, int(resp.fields.get("from", q.before)),
                          int(resp.fields.get("to", q.after)))
