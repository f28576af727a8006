"""Queue locks for ordered consumers: which member of a group holds which queue, until when.

An ordered consumer locks each queue it was assigned (LOCK) before taking
messages from it and renews the locks every 20 s; a lock lives `expiry_ms`
(60 s by default) after its last grant. A queue held by another member is not
granted until that member unlocks it (UNLOCK), unregisters, stops
heart-beating (ConsumerManager expiry drops its locks) or lets the lock
expire.

Locks live in memory only, so a restarted broker does not know who held
what. A member stops taking messages from a queue once half the expiry passed
since its last grant; a restarted broker therefore grants nothing during its
first half expiry (`start_grace`, called by the app only when its store
already held messages, i.e. it may have granted locks before). Otherwise a member that
sees a partial member list right after the restart could lock a queue whose
old holder still takes messages from it, and break the queue's order.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from ferry.errors import BusyError

#: Queue ids in one LOCK or UNLOCK request.
MAX_LOCK_QUEUE_IDS = 1024
#: Locks held on one broker (live ones; expired ones are purged first when full).
MAX_LOCKS = 200_000

LockKey = tuple[str, str, int]  # (group, topic, queue_id)
ClientKey = tuple[str, str]  # (group, client_id)


class QueueLockTable:
    """(group, topic, queue_id) -> (client_id, expires_at), and each client's keys."""

    def __init__(self, expiry_ms: int, clock_ms: Callable[[], float] | None = None,
                 max_locks: int = MAX_LOCKS) -> None:
        self.expiry_ms = expiry_ms
        self._clock_ms = clock_ms or (lambda: time.monotonic() * 1000.0)
        self._max_locks = max_locks
        self._grant_from_ms = 0.0  # see start_grace
        self._locks: dict[LockKey, tuple[str, float]] = {}
        self._by_client: dict[ClientKey, set[LockKey]] = {}

    def __len__(self) -> int:
        """Live locks (expired ones are left out)."""
        now = self._clock_ms()
        return sum(1 for _, expires_at in self._locks.values() if expires_at > now)

    def lock(self, group: str, client_id: str, topic: str, queue_ids: Iterable[int]) -> list[int]:
        """Grant or renew each queue this client may hold; the ones now held, sorted.

        A queue held by another client whose lock has not expired is left out; so
        is every queue during the grace period after a restart. BusyError when the
        table is full of live locks.
        """
        now = self._clock_ms()
        if now < self._grant_from_ms:
            return []
        expires_at = now + self.expiry_ms
        mine = self._by_client.get((group, client_id))
        held: list[int] = []
        for queue_id in sorted(set(queue_ids)):
            key = (group, topic, queue_id)
            holder = self._locks.get(key)
            if holder is not None and holder[0] != client_id and holder[1] > now:
                continue
            if holder is None and len(self._locks) >= self._max_locks:
                self.purge_expired()
                if len(self._locks) >= self._max_locks:
                    raise BusyError(f"too many queue locks on this broker (limit "
                                    f"{self._max_locks})")
            if holder is not None and holder[0] != client_id:
                self._forget(holder[0], group, key)  # expired: taken over
            self._locks[key] = (client_id, expires_at)
            if mine is None:
                mine = self._by_client[(group, client_id)] = set()
            mine.add(key)
            held.append(queue_id)
        return held

    def unlock(self, group: str, client_id: str, topic: str, queue_ids: Iterable[int]) -> int:
        """Release those of the queues this client holds; returns how many."""
        released = 0
        for queue_id in set(queue_ids):
            key = (group, topic, queue_id)
            holder = self._locks.get(key)
            if holder is not None and holder[0] == client_id:
                del self._locks[key]
                self._forget(client_id, group, key)
                released += 1
        return released

    def drop_client(self, group: str, client_id: str) -> int:
        """Release every lock of this client (it unregistered or expired)."""
        keys = self._by_client.pop((group, client_id), set())
        for key in keys:
            del self._locks[key]
        return len(keys)

    def start_grace(self, grace_ms: float) -> None:
        """Grant no lock for `grace_ms` from now (a restart: see the module doc)."""
        self._grant_from_ms = self._clock_ms() + grace_ms

    def purge_expired(self) -> int:
        """Forget every expired lock; returns how many."""
        now = self._clock_ms()
        dead = [(key, cid) for key, (cid, expires_at) in self._locks.items() if expires_at <= now]
        for key, cid in dead:
            del self._locks[key]
            self._forget(cid, key[0], key)
        return len(dead)

    def _forget(self, client_id: str, group: str, key: LockKey) -> None:
        keys = self._by_client.get((group, client_id))
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self._by_client[(group, client_id)]
