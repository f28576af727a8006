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
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from ferry.client.fetcher import QueueFetcher
from ferry.client.message import TopicQueue
from ferry.client.queue_locks import QueueLocks

if TYPE_CHECKING:
    from ferry.client.consumer import Consumer

log = logging.getLogger(__name__)

#: How often a queue assigned to this member but locked by another is asked for.
LOCK_RETRY_MS = 1_000
#: How often a release checks whether the queue's message in flight finished.
RELEASE_POLL_MS = 20
#: The renewal interval is at most this fraction of the broker's lock expiry.
RENEWALS_PER_EXPIRY = 3

Forget = Callable[[TopicQueue, bool], Awaitable[None]]


class OrderedQueues:
    """The locks of an ordered consumer and the rules above; the Consumer calls it from `_apply`."""

    def __init__(self, consumer: Consumer) -> None:
        self.consumer = consumer
        self.locks = (QueueLocks(consumer._pool, consumer._routes, group=consumer.group,
                                 client_id=consumer.client_id)
                      if consumer.mode == "clustering" else None)
        self.renew_interval_ms = consumer.lock_renew_interval_ms
        self.wanted: dict[str, set[TopicQueue] | None] = {}   # the last rebalance's answer
        self.target: set[TopicQueue] = set()                  # the queues this member should serve
        self.releasing: dict[TopicQueue, asyncio.Task[None]] = {}
        self._waiting: set[TopicQueue] = set()
        self._keeper: asyncio.Task[None] | None = None

    # -- what may be handed out -------------------------------------------------------------
    def serving(self, tq: TopicQueue, fetcher: QueueFetcher) -> bool:
        """True while records of `fetcher` (serving `tq`) may be handed to the application."""
        c = self.consumer
        return (c.started and c._fetchers.get(tq) is fetcher
                and (self.locks is None or self.locks.valid(tq)))

    def lapsed(self) -> set[TopicQueue]:
        """Served queues whose lock is no longer valid: to be dropped now."""
        if self.locks is None:
            return set()
        return {tq for tq in self.consumer._fetchers if not self.locks.valid(tq)}

    # -- rebalance ---------------------------------------------------------------------------
    async def adopt(self) -> None:
        """Ordered mode turned on for a running consumer: lock what it serves already."""
        if self.locks is not None:
            await self.locks.lock(self.consumer._fetchers)
        self._ensure_keeper()

    async def admit(self, target: set[TopicQueue], gained: list[TopicQueue]) -> list[TopicQueue]:
        """Of the queues to start, those that may start now (locked, not still being released)."""
        self.target = set(target)
        self._ensure_keeper()
        ready = [tq for tq in gained if tq not in self.releasing]
        if self.locks is None or not ready:
            return ready
        granted = await self.locks.lock(ready)
        waiting = set(ready) - granted
        if waiting - self._waiting:
            log.info("%s waits for the locks of %s (another member still holds them)",
                     self.consumer.client_id, [str(tq) for tq in sorted(waiting - self._waiting)])
        self._waiting = waiting
        return [tq for tq in ready if tq in granted]

    def release(self, tq: TopicQueue, forget: Forget) -> None:
        """Release `tq` (its fetcher already stopped) once its record in flight finished."""
        self._ensure_keeper()
        task = asyncio.get_running_loop().create_task(self._release(tq, forget),
                                                      name=f"ferry-release-{tq}")
        self.releasing[tq] = task
        task.add_done_callback(lambda t: self._released(tq, t))

    def _released(self, tq: TopicQueue, task: asyncio.Task[None]) -> None:
        if self.releasing.get(tq) is task:
            del self.releasing[tq]
        if not task.cancelled() and task.exception() is not None:
            log.error("release of %s failed", tq, exc_info=task.exception())

    async def _release(self, tq: TopicQueue, forget: Forget) -> None:
        pending = self.consumer._pending
        while pending.floor(tq) is not None:   # a handler, a send-back still running
            await asyncio.sleep(RELEASE_POLL_MS / 1000)
        owned = self.locks is None or self.locks.owned(tq)
        if not owned:
            log.warning("%s: the lock of %s lapsed; its position is left to the next owner",
                        self.consumer.client_id, tq)
        await forget(tq, owned)
        if self.locks is not None and tq not in self.target:
            await self.locks.unlock([tq])

    # -- renewals -----------------------------------------------------------------------------
    def _ensure_keeper(self) -> None:
        if self.locks is None or not self.consumer.started:
            return
        if self._keeper is None or self._keeper.done():
            self._keeper = asyncio.get_running_loop().create_task(self._keep(),
                                                                  name="ferry-lock-keeper")
            self.consumer._tasks.append(self._keeper)   # stop() cancels it

    def _renew_s(self) -> float:
        interval_ms: float = self.renew_interval_ms
        if self.locks is not None and self.locks.expiry_ms:
            interval_ms = min(interval_ms, self.locks.expiry_ms / RENEWALS_PER_EXPIRY)
        return interval_ms / 1000

    def _next_wake(self, next_renew: float) -> float:
        """When the keeper must look again: a renewal, a lock lapsing, a queue waiting."""
        assert self.locks is not None
        wake = next_renew
        for tq in self.consumer._fetchers:
            until = self.locks.valid_until(tq)
            if until is not None:
                wake = min(wake, until)
        if self.target - set(self.consumer._fetchers) - set(self.releasing):
            wake = min(wake, time.monotonic() + LOCK_RETRY_MS / 1000)
        return wake

    async def _keep(self) -> None:
        """Renew the held locks, drop lapsed queues, ask for the waiting ones; until cancelled."""
        locks = self.locks
        assert locks is not None
        consumer = self.consumer
        renewed = time.monotonic()
        try:
            while True:
                # the interval shrinks once a broker told its expiry: computed each round
                await asyncio.sleep(max(0.0, self._next_wake(renewed + self._renew_s())
                                        - time.monotonic()))
                try:
                    async with consumer._rebalance_lock:
                        if time.monotonic() >= renewed + self._renew_s():
                            renewed = time.monotonic()
                            # A queue whose lock lapsed already is not renewed: it is dropped
                            # below and served again only from its committed position.
                            held = {tq for tq in consumer._fetchers if locks.valid(tq)}
                            await locks.lock(held | set(self.releasing))
                        await consumer._apply(self.wanted)
                except Exception:   # keep renewing whatever happened to one round
                    log.exception("lock renewal round failed; retrying")
                    await asyncio.sleep(LOCK_RETRY_MS / 1000)
        finally:
            for task in list(self.releasing.values()):
                task.cancel()
