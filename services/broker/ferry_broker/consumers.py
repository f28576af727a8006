"""Live consumers: which client ids of which group sent a heartbeat recently.

Consumers send HEARTBEAT every few seconds with the topics they subscribe to;
a client that stays silent for `expiry_ms` (30 s by default) is dropped, and
UNREGISTER drops it at once. GET_CONSUMERS answers the sorted live ids so that
every member of a group computes the same queue assignment (rebalance).
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

MAX_CLIENTS_PER_GROUP = 10_000
MAX_GROUPS = 100_000


@dataclass(frozen=True)
class ConsumerInfo:
    """One client's last heartbeat."""

    client_id: str
    topics: frozenset[str]
    mode: str
    last_seen_ms: float


class ConsumerManager:
    """Group -> client id -> last heartbeat, with expiry."""

    def __init__(self, expiry_ms: int, clock_ms: Callable[[], float] | None = None) -> None:
        self._expiry_ms = expiry_ms
        self._clock_ms = clock_ms or (lambda: time.monotonic() * 1000.0)
        self._groups: dict[str, dict[str, ConsumerInfo]] = {}

    def heartbeat(self, client_id: str, group: str, topics: frozenset[str], mode: str) -> bool:
        """Record a heartbeat; returns False when a limit refuses a new client or group."""
        members = self._groups.get(group)
        if members is None:
            if len(self._groups) >= MAX_GROUPS:
                self.expire()
                if len(self._groups) >= MAX_GROUPS:
                    return False
            members = self._groups[group] = {}
        if client_id not in members and len(members) >= MAX_CLIENTS_PER_GROUP:
            return False
        members[client_id] = ConsumerInfo(client_id, topics, mode, self._clock_ms())
        return True

    def unregister(self, client_id: str, group: str) -> bool:
        members = self._groups.get(group)
        if members is None or members.pop(client_id, None) is None:
            return False
        if not members:
            del self._groups[group]
        return True

    def members(self, group: str, topic: str | None = None) -> list[str]:
        """Sorted live client ids of `group`, only those subscribed to `topic` if given."""
        self._expire_group(group)
        members = self._groups.get(group, {})
        return sorted(
            cid for cid, info in members.items() if topic is None or topic in info.topics
        )

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
        for cid in dead:
            del members[cid]
        if not members:
            del self._groups[group]
        return len(dead)
