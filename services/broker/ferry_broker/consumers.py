"""Live consumers: which client ids of which group sent a heartbeat recently.

Consumers send HEARTBEAT every few seconds with the topics they subscribe to;
a client that stays silent for `expiry_ms` (30 s by default) is dropped, and
UNREGISTER drops it at once. GET_CONSUMERS answers the sorted live ids, with
the start time (`joined_ms`) each one sent, so that every member of a group
computes the same queue assignment (rebalance; consistent_hash takes the
members in join order).

A heartbeat may carry the member's subscriptions (topic -> tags and sql, as
checked by the handler); the manager keeps them, compares a group's members
whenever its membership or a subscription changes (`subscription_conflicts`),
and tells its `on_leave` listeners (the queue lock table) when a member goes.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from ferry_broker.subscription_conflicts import ConflictTracker, SubFields, group_conflicts

MAX_CLIENTS_PER_GROUP = 10_000
MAX_GROUPS = 100_000


@dataclass(frozen=True)
class ConsumerInfo:
    """One client's last heartbeat."""

    client_id: str
    topics: frozenset[str]
    mode: str
    last_seen_ms: float
    # topic -> normalized subscription; None when the client sent none (an old client)
    subscriptions: Mapping[str, SubFields] | None = None
    # when the client started (epoch ms, as it says): orders members for allocation; 0 unknown
    joined_ms: int = 0

    def same_interest(self, other: ConsumerInfo) -> bool:
        return (self.topics, self.mode, self.subscriptions) == (other.topics, other.mode,
                                                                other.subscriptions)


class ConsumerManager:
    """Group -> client id -> last heartbeat, with expiry."""

    def __init__(self, expiry_ms: int, clock_ms: Callable[[], float] | None = None) -> None:
        self._expiry_ms = expiry_ms
        self._clock_ms = clock_ms or (lambda: time.monotonic() * 1000.0)
        self._groups: dict[str, dict[str, ConsumerInfo]] = {}
        self.conflicts = ConflictTracker()
        #: Called with (group, client_id) when a member unregisters or expires.
        self.on_leave: list[Callable[[str, str], object]] = []

    def heartbeat(self, client_id: str, group: str, topics: frozenset[str], mode: str,
                  subscriptions: Mapping[str, SubFields] | None = None,
                  joined_ms: int = 0) -> bool:
        """Record a heartbeat; returns False when a limit refuses a new client or group."""
        members = self._groups.get(group)
        if members is None:
            if len(self._groups) >= MAX_GROUPS:
                self.expire()
                if len(self._groups) >= MAX_GROUPS:
                    return False
            members = self._groups[group] = {}
        before = members.get(client_id)
        if before is None and len(members) >= MAX_CLIENTS_PER_GROUP:
            return False
        info = ConsumerInfo(client_id, topics, mode, self._clock_ms(), subscriptions, joined_ms)
        members[client_id] = info
        if before is None or not before.same_interest(info):
            self._expire_group(group)  # compare live members only
            self._check_conflicts(group)
        return True

    def unregister(self, client_id: str, group: str) -> bool:
        members = self._groups.get(group)
        if members is None or members.pop(client_id, None) is None:
            return False
        if not members:
            del self._groups[group]
        self._left(group, [client_id])
        return True

    def touch(self, client_id: str, group: str) -> None:
        """A known member proved alive another way (a LOCK): it expires no sooner than now.

        Its locks are dropped when it expires, and it stops serving a queue
        once its last granted LOCK is half an expiry old: counting the LOCK as
        a sign of life keeps the broker's drop after the client's own stop.
        """
        info = self._groups.get(group, {}).get(client_id)
        if info is not None:
            self._groups[group][client_id] = replace(info, last_seen_ms=self._clock_ms())

    def members(self, group: str, topic: str | None = None) -> list[str]:
        """Sorted live client ids of `group`, only those subscribed to `topic` if given."""
        return [info.client_id for info in self.member_infos(group, topic)]

    def member_infos(self, group: str, topic: str | None = None) -> list[ConsumerInfo]:
        """The live members of `group` (on `topic` if given), sorted by client id."""
        self._expire_group(group)
        members = self._groups.get(group, {})
        return sorted((info for info in members.values() if topic is None or topic in info.topics),
                      key=lambda i: i.client_id)

    def groups(self) -> dict[str, list[ConsumerInfo]]:
        self.expire()
        return {g: sorted(m.values(), key=lambda i: i.client_id) for g, m in self._groups.items()}

    def expire(self) -> int:
        """Drop every client silent for longer than the expiry; returns how many."""
        return sum(self._expire_group(group) for group in list(self._groups))

    def _expire_group(self, group: str) -> int:
        members = self._groups.get(group)
        if not members:
            return 0
        cutoff = self._clock_ms() - self._expiry_ms
        dead = [cid for cid, info in members.items() if info.last_seen_ms < cutoff]
        if not dead:
            return 0
        for cid in dead:
            del members[cid]
        if not members:
            del self._groups[group]
        self._left(group, dead)
        return len(dead)

    def _left(self, group: str, client_ids: list[str]) -> None:
        for cid in client_ids:
            for listener in self.on_leave:
                listener(group, cid)
        self._check_conflicts(group)

    def _check_conflicts(self, group: str) -> None:
        members = self._groups.get(group, {})
        # Only clustering members share queues: a broadcasting member reads every queue
        # for itself, so what its filter skips costs nobody else anything.
        self.conflicts.update(group, group_conflicts(
            {cid: (info.topics, info.subscriptions) for cid, info in members.items()
             if info.mode == "clustering"}))
