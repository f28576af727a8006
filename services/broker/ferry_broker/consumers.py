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

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from ferry_broker.members import HeartbeatTable
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


class ConsumerManager(HeartbeatTable[ConsumerInfo]):
    """Group -> client id -> last heartbeat, with expiry."""

    def __init__(self, expiry_ms: int, clock_ms: Callable[[], float] | None = None) -> None:
        super().__init__(expiry_ms, MAX_GROUPS, MAX_CLIENTS_PER_GROUP, clock_ms)
        self.conflicts = ConflictTracker()
        #: Called with (group, client_id) when a member unregisters or expires.
        self.on_leave: list[Callable[[str, str], object]] = []

    def heartbeat(self, client_id: str, group: str, topics: frozenset[str], mode: str,
                  subscriptions: Mapping[str, SubFields] | None = None,
                  joined_ms: int = 0) -> bool:
        """Record a heartbeat; returns False when a limit refuses a new client or group."""
        members = self._admit(group, client_id)
        if members is None:
            return False
        before = members.get(client_id)
        info = ConsumerInfo(client_id, topics, mode, self._clock_ms(), subscriptions, joined_ms)
        members[client_id] = info
        if before is None or not before.same_interest(info):
            self._expire_group(group)  # compare live members only
            self._check_conflicts(group)
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

    def _left(self, group: str, gone: list[ConsumerInfo]) -> None:
        for info in gone:
            for listener in self.on_leave:
                listener(group, info.client_id)
        self._check_conflicts(group)

    def _check_conflicts(self, group: str) -> None:
        members = self._groups.get(group, {})
        # Only clustering members share queues: a broadcasting member reads every queue
        # for itself, so what its filter skips costs nobody else anything.
        self.conflicts.update(group, group_conflicts(
            {cid: (info.topics, info.subscriptions) for cid, info in members.items()
             if info.mode == "clustering"}))
