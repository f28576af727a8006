"""An ordered consumer's queue locks as this client counts them (LOCK / UNLOCK, protocol 32, 33).

The broker keeps a lock `expiry_ms` after it granted or renewed it. The client
cannot know when the broker handled its request, only when it sent it, which is
earlier: so a lock asked for at time t counts as

- *valid* until t + expiry_ms / 2: the client takes messages from the queue only
  then. The other half of the expiry is the margin in which a message already in
  a handler finishes (and its offset is committed) before the broker may give the
  queue to another member, whatever the network delays and clock rates;
- *owned* until t + expiry_ms: no other member can hold it before then, so a
  commit of this client's position is still safe after the lock stopped being
  valid.

Requests go one per broker and topic (at most `MAX_LOCK_QUEUES` queue ids
each), to all brokers at once. A LOCK that fails leaves the queues' times as
they were: they lapse when due unless a later renewal succeeds. Times come from
`clock` (seconds, monotonic), so tests can drive it.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from ferry.client.core.message import TopicQueue
from ferry.client.core.namesrv import RouteCache
from ferry.client.core.offsets import broker_addr
from ferry.errors import FerryError
from ferry.wire import RequestCode

log = logging.getLogger(__name__)

#: The most queue ids one LOCK / UNLOCK carries (docs/protocol.md, 32 LOCK).
MAX_LOCK_QUEUES = 1024


class _Requester(Protocol):
    """What QueueLocks needs of a ConnectionPool (a test may pass a fake)."""

    async def request(self, addr: str, code: int, fields: dict[str, Any],
                      body: bytes = b"", *, timeout_ms: int | None = None) -> Any: ...


@dataclass(frozen=True, slots=True)
class LockGrant:
    """One granted lock: until when it is valid and owned (clock seconds)."""

    valid_until: float
    owned_until: float


class QueueLocks:
    """The locks this client holds, by queue, and the LOCK / UNLOCK requests that change them."""

    def __init__(self, pool: _Requester, routes: RouteCache, *, group: str, client_id: str,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.pool = pool
        self.routes = routes
        self.group = group
        self.client_id = client_id
        self.clock = clock
        self.expiry_ms: int | None = None   # the brokers' lock expiry, once one answered
        self._grants: dict[TopicQueue, LockGrant] = {}

    def valid(self, tq: TopicQueue) -> bool:
        """True while messages of `tq` may be taken (see the module doc)."""
        grant = self._grants.get(tq)
        return grant is not None and self.clock() < grant.valid_until

    def owned(self, tq: TopicQueue) -> bool:
        """True while no other member can hold `tq` yet (a commit is safe)."""
        grant = self._grants.get(tq)
        return grant is not None and self.clock() < grant.owned_until

    def valid_until(self, tq: TopicQueue) -> float | None:
        grant = self._grants.get(tq)
        return grant.valid_until if grant is not None else None

    def held(self) -> set[TopicQueue]:
        """The queues with a lock still owned (what a renewal asks for again)."""
        now = self.clock()
        return {tq for tq, g in self._grants.items() if now < g.owned_until}

    async def lock(self, tqs: Iterable[TopicQueue]) -> set[TopicQueue]:
        """LOCK (or renew) `tqs`; returns those of them valid now."""
        wanted = sorted(set(tqs))
        batches = await self._batches(wanted)
        await asyncio.gather(*(self._lock_batch(addr, queues) for addr, queues in batches))
        return {tq for tq in wanted if self.valid(tq)}

    async def unlock(self, tqs: Iterable[TopicQueue]) -> None:
        """Forget `tqs` here and UNLOCK them at their brokers (failures are logged)."""
        wanted = sorted(set(tqs))
        for tq in wanted:
            self._grants.pop(tq, None)
        batches = await self._batches(wanted)
        await asyncio.gather(*(self._send(addr, RequestCode.UNLOCK, queues)
                               for addr, queues in batches))

    async def _batches(self, tqs: list[TopicQueue]) -> list[tuple[str, list[TopicQueue]]]:
        """`tqs` by broker address and topic, each list at most MAX_LOCK_QUEUES long."""
        out: dict[tuple[str, str], list[TopicQueue]] = {}
        for tq in tqs:
            try:
                addr = await broker_addr(self.routes, tq)
            except FerryError as exc:   # no route now: its lock lapses unless renewed later
                log.info("cannot lock %s now: %s", tq, exc)
                continue
            out.setdefault((addr, tq.topic), []).append(tq)
        return [(addr, queues[start:start + MAX_LOCK_QUEUES])
                for (addr, _topic), queues in out.items()
                for start in range(0, len(queues), MAX_LOCK_QUEUES)]

    async def _lock_batch(self, addr: str, queues: list[TopicQueue]) -> None:
        sent = self.clock()   # before sending: the broker's grant can only be later
        fields = await self._send(addr, RequestCode.LOCK, queues)
        if fields is None:
            return
        try:
            expiry_ms = int(fields["expiry_ms"])
            locked = {int(q) for q in fields.get("locked") or ()}
        except (KeyError, TypeError, ValueError):
            log.warning("malformed LOCK answer from %s: %r", addr, fields)
            return
        self.expiry_ms = expiry_ms
        grant = LockGrant(sent + expiry_ms / 2000, sent + expiry_ms / 1000)
        for tq in queues:
            if tq.queue_id in locked:
                self._grants[tq] = grant
            elif self._grants.pop(tq, None) is not None:
                log.warning("%s: lock of %s was not renewed (another member holds it)",
                            self.client_id, tq)

    async def _send(self, addr: str, code: int,
                    queues: list[TopicQueue]) -> dict[str, Any] | None:
        fields = {"group": self.group, "client_id": self.client_id, "topic": queues[0].topic,
                  "queue_ids": [tq.queue_id for tq in queues]}
        try:
            resp = await self.pool.request(addr, code, fields)
        except FerryError as exc:
            log.info("%s of %s queues %s at %s failed: %s", RequestCode(code).name,
                     queues[0].topic, [tq.queue_id for tq in queues], addr, exc)
            return None
        return dict(resp.fields)
