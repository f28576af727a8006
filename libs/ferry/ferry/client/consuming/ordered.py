"""Ordered consumption: the queue discipline of an ordered consumer (locks through rebalances).

An ordered consumer in a clustering group (`Consumer(..., ordered=True)`, or
`run(handler, ordered=True)`) keeps these rules, so that two members never
take messages from one queue at once and a queue changes hands only at a
committed position:

- a queue the rebalance gives this member is served (its committed offset read,
  its fetcher started) only once LOCK granted it (see `queue_locks`). One held by
  another member is asked for again every `LOCK_RETRY_MS` and on each rebalance
  round: the other member unlocks it once it let it go;
- the held locks are renewed every `lock_renew_interval_ms`, at most a third of
  the broker's lock expiry, so that a renewal comes well before a lock stops
  being valid here (half the expiry);
- records are handed out (getmany, iteration, `run`) only from queues whose lock
  is valid now; a served queue whose lock stopped being valid (renewals failed) is
  dropped at once, like a lost one, before the broker may give it to another;
- a lost queue is released in the background: its fetcher stops at once; once no
  record of it is in flight (nothing of it pending), its position is committed
  (only while the lock is still owned, so a late member never moves back the
  position of the next owner), then it is UNLOCKed, unless the rebalance wants it
  back meanwhile. Its lock is renewed until then.

Broadcasting groups read every queue in every member: no locks, only the
one-at-a-time discipline of `runner.OrderedRunner`.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Protocol

from ferry.client.consuming.fetcher import QueueFetcher
from ferry.client.consuming.queue_locks import QueueLocks
from ferry.client.consuming.retry import PendingOffsets
from ferry.client.core.connection import ConnectionPool
from ferry.client.core.message import TopicQueue
from ferry.client.core.namesrv import RouteCache

log = logging.getLogger(__name__)

#: How often a queue assigned to this member but locked by another is asked for.
LOCK_RETRY_MS = 1_000
#: How often a release checks whether the queue's message in flight finished.
RELEASE_POLL_MS = 20
#: The renewal interval is at most this fraction of the broker's lock expiry.
RENEWALS_PER_EXPIRY = 3

_ADMIT = "%admit"   # the keeper's admission task (its other tasks are named by broker)

Forget = Callable[[TopicQueue, bool], Awaitable[None]]


class OrderedHost(Protocol):
    """What OrderedQueues uses of its host, the consumer's `assignment.Assignment`: the
    consumer's identity, its fetchers and pending offsets, and the rebalance step (a
    Protocol: the assignment imports this module)."""

    group: str
    client_id: str
    mode: str
    lock_renew_interval_ms: int
    pool: ConnectionPool
    routes: RouteCache
    fetchers: dict[TopicQueue, QueueFetcher]
    pending: PendingOffsets
    tasks: list[asyncio.Task[None]]
    rebalance_lock: asyncio.Lock

    @property
    def started(self) -> bool: ...

    async def forget(self, tq: TopicQueue, commit: bool = True) -> None: ...

    async def apply(self, wanted: dict[str, set[TopicQueue] | None]) -> None: ...


class OrderedQueues:
    """The locks of an ordered consumer and the rules above; its `Assignment` calls it from `apply`."""

    def __init__(self, host: OrderedHost) -> None:
        self.host = host
        self.locks = (QueueLocks(host.pool, host.routes, group=host.group,
                                 client_id=host.client_id)
                      if host.mode == "clustering" else None)
        self.renew_interval_ms = host.lock_renew_interval_ms
        self.wanted: dict[str, set[TopicQueue] | None] = {}   # the last rebalance's answer
        self.target: set[TopicQueue] = set()                  # the queues this member should serve
        self.releasing: dict[TopicQueue, asyncio.Task[None]] = {}
        self._waiting: set[TopicQueue] = set()
        self._keeper: asyncio.Task[None] | None = None
        self._changed = asyncio.Event()

    # -- what may be handed out -------------------------------------------------------------
    def serving(self, tq: TopicQueue, fetcher: QueueFetcher) -> bool:
        """True while records of `fetcher` (serving `tq`) may be handed to the application."""
        c = self.host
        return (c.started and c.fetchers.get(tq) is fetcher
                and (self.locks is None or self.locks.valid(tq)))

    def lapsed(self) -> set[TopicQueue]:
        """Served queues whose lock is no longer valid: to be dropped now."""
        if self.locks is None:
            return set()
        return {tq for tq in self.host.fetchers if not self.locks.valid(tq)}

    # -- rebalance ---------------------------------------------------------------------------
    async def adopt(self) -> None:
        """Ordered mode turned on for a running consumer: lock what it serves already."""
        if self.locks is not None:
            await self.locks.lock(self.host.fetchers)
        self._ensure_keeper()

    async def admit(self, target: set[TopicQueue], gained: list[TopicQueue]) -> list[TopicQueue]:
        """Of the queues to start, those that may start now (locked, not still being released)."""
        self.target = set(target)
        self._ensure_keeper()
        ready = [tq for tq in gained if tq not in self.releasing]
        if self.locks is None:
            return ready
        # Locked once but never served (it could not start) and no longer wanted: let it go.
        stale = self.locks.held() - self.target - set(self.host.fetchers) - set(self.releasing)
        if stale:
            await self.locks.unlock(stale)
        if not ready:
            return ready
        granted = await self.locks.lock(ready)
        waiting = set(ready) - granted
        if waiting - self._waiting:
            log.info("%s waits for the locks of %s (another member still holds them)",
                     self.host.client_id, [str(tq) for tq in sorted(waiting - self._waiting)])
        self._waiting = waiting
        return [tq for tq in ready if tq in granted]

    def drop_lapsed(self) -> None:
        """Stop handing out served queues whose lock is no longer valid, at once.

        Synchronous (no await), so it needs no rebalance lock: the keeper runs it
        on time even while a rebalance waits for a broker that does not answer.
        """
        for tq in sorted(self.lapsed()):
            fetcher = self.host.fetchers.pop(tq)
            log.warning("%s: the lock of %s is no longer valid (not renewed in time); "
                        "dropping the queue", self.host.client_id, tq)
            self.release(tq, fetcher, self.host.forget)

    def release(self, tq: TopicQueue, fetcher: QueueFetcher, forget: Forget) -> None:
        """Release `tq` (no longer handed out) once its record in flight finished."""
        self._ensure_keeper()
        task = asyncio.get_running_loop().create_task(self._release(tq, fetcher, forget),
                                                      name=f"ferry-release-{tq}")
        self.releasing[tq] = task
        task.add_done_callback(lambda t: self._released(tq, t))

    def _released(self, tq: TopicQueue, task: asyncio.Task[None]) -> None:
        if self.releasing.get(tq) is task:
            del self.releasing[tq]
        if not task.cancelled() and task.exception() is not None:
            log.error("release of %s failed", tq, exc_info=task.exception())

    async def _release(self, tq: TopicQueue, fetcher: QueueFetcher, forget: Forget) -> None:
        await fetcher.stop()
        pending = self.host.pending
        while pending.floor(tq) is not None:   # a handler, a send-back still running
            await asyncio.sleep(RELEASE_POLL_MS / 1000)
        owned = self.locks is None or self.locks.owned(tq)
        if not owned:
            log.warning("%s: the lock of %s lapsed; its position is left to the next owner",
                        self.host.client_id, tq)
        await forget(tq, owned)
        if self.locks is not None and tq not in self.target:
            await self.locks.unlock([tq])

    # -- renewals -----------------------------------------------------------------------------
    def poke(self) -> None:
        """Served queues changed: the keeper looks at their lock times again."""
        self._changed.set()

    def _ensure_keeper(self) -> None:
        if self.locks is None or not self.host.started:
            return
        if self._keeper is None or self._keeper.done():
            self._keeper = asyncio.get_running_loop().create_task(self._keep(),
                                                                  name="ferry-lock-keeper")
            self.host.tasks.append(self._keeper)   # stop() cancels it

    def _renew_s(self) -> float:
        interval_ms: float = self.renew_interval_ms
        if self.locks is not None and self.locks.expiry_ms:
            interval_ms = min(interval_ms, self.locks.expiry_ms / RENEWALS_PER_EXPIRY)
        return interval_ms / 1000

    def _waiting_queues(self) -> set[TopicQueue]:
        return self.target - set(self.host.fetchers) - set(self.releasing)

    def _next_wake(self, next_renew: float) -> float:
        """When the keeper must look again: a renewal, a lock lapsing, a queue waiting."""
        assert self.locks is not None
        wake = next_renew
        for tq in self.host.fetchers:
            until = self.locks.valid_until(tq)
            wake = min(wake, until if until is not None else 0.0)
        if self._waiting_queues():
            wake = min(wake, time.monotonic() + LOCK_RETRY_MS / 1000)
        return wake

    async def _keep(self) -> None:
        """Drop lapsed queues, renew the held locks, ask for the waiting ones; until cancelled.

        The keeper itself never waits for a broker: renewals and admissions run as
        tasks of their own (one of each at a time), so a broker that does not
        answer cannot delay dropping a lapsed queue.
        """
        renewed = time.monotonic()
        side: dict[str, asyncio.Task[None]] = {}
        loop = asyncio.get_running_loop()
        try:
            while True:
                self._changed.clear()
                delay = self._next_wake(renewed + self._renew_s()) - time.monotonic()
                if delay > 0:
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(delay):
                            await self._changed.wait()
                self.drop_lapsed()
                now = time.monotonic()
                if now >= renewed + self._renew_s():
                    renewed = now
                    for broker, tqs in self._to_renew().items():
                        # one task per broker: one that does not answer delays no other;
                        # its renewal still waiting from last round: this round is skipped
                        if _idle(side, broker):
                            side[broker] = loop.create_task(self._renew(tqs),
                                                            name=f"ferry-lock-renew-{broker}")
                if self._waiting_queues() and _idle(side, _ADMIT):
                    side[_ADMIT] = loop.create_task(self._admit_waiting(),
                                                     name="ferry-lock-admit")
        finally:
            for task in [*side.values(), *self.releasing.values()]:
                task.cancel()

    def _to_renew(self) -> dict[str, list[TopicQueue]]:
        """By broker: every queue served with a valid lock, and those being released."""
        assert self.locks is not None
        # A queue whose lock lapsed already is not renewed: it was dropped and is
        # served again only from its committed position, once locked anew.
        held = {tq for tq in self.host.fetchers if self.locks.valid(tq)}
        out: dict[str, list[TopicQueue]] = {}
        for tq in sorted(held | set(self.releasing)):
            out.setdefault(tq.broker, []).append(tq)
        return out

    async def _renew(self, tqs: list[TopicQueue]) -> None:
        assert self.locks is not None
        try:
            await self.locks.lock(tqs)
        except Exception:   # the next round tries again; lapses are handled meanwhile
            log.exception("lock renewal failed")
        self.poke()

    async def _admit_waiting(self) -> None:
        """A rebalance step without asking for members: LOCK and start the waiting queues."""
        try:
            async with self.host.rebalance_lock:
                await self.host.apply(self.wanted)
        except Exception:
            log.exception("starting queues waiting for their locks failed")


def _idle(side: dict[str, asyncio.Task[None]], name: str) -> bool:
    task = side.get(name)
    return task is None or task.done()
