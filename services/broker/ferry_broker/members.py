"""Group -> client id -> last heartbeat, with bounds and expiry.

What the live-consumer table (`consumers.py`) and the live-producer table
(`producers.py`) share: a new group or client beyond the limits is refused
(after one expiry pass), and a client silent for `expiry_ms` is dropped.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar


class Member(Protocol):
    """A client's last heartbeat as the table sees it."""

    @property
    def client_id(self) -> str: ...

    @property
    def last_seen_ms(self) -> float: ...


M = TypeVar("M", bound=Member)


class HeartbeatTable(Generic[M]):
    """Live members by group; subclasses say what else a member's arrival or leave does."""

    def __init__(self, expiry_ms: int, max_groups: int, max_members: int,
                 clock_ms: Callable[[], float] | None = None) -> None:
        self._expiry_ms = expiry_ms
        self._max_groups, self._max_members = max_groups, max_members
        self._clock_ms = clock_ms or (lambda: time.monotonic() * 1000.0)
        self._groups: dict[str, dict[str, M]] = {}

    def _admit(self, group: str, client_id: str) -> dict[str, M] | None:
        """The group's members, ready for `client_id`'s entry; None when a limit refuses
        a new group or a new client."""
        members = self._groups.get(group)
        if members is None:
            if len(self._groups) >= self._max_groups:
                self.expire()
                if len(self._groups) >= self._max_groups:
                    return None
            members = self._groups[group] = {}
        if client_id not in members and len(members) >= self._max_members:
            return None
        return members

    def unregister(self, client_id: str, group: str) -> bool:
        """Drop a member at once (it said goodbye); False when it was not there."""
        members = self._groups.get(group)
        info = members.pop(client_id, None) if members is not None else None
        if info is None:
            return False
        if not members:
            self._drop_group(group)
        self._left(group, [info])
        return True

    def expire(self) -> int:
        """Drop every client silent for longer than the expiry; returns how many."""
        return sum(self._expire_group(group) for group in list(self._groups))

    def _expire_group(self, group: str) -> int:
        members = self._groups.get(group)
        if not members:
            return 0
        cutoff = self._clock_ms() - self._expiry_ms
        dead = [info for info in members.values() if info.last_seen_ms < cutoff]
        if not dead:
            return 0
        for info in dead:
            del members[info.client_id]
        if not members:
            self._drop_group(group)
        self._left(group, dead)
        return len(dead)

    def _drop_group(self, group: str) -> None:
        del self._groups[group]

    def _left(self, group: str, gone: list[M]) -> None:
        """Members `gone` left `group` (expired or unregistered); the default does nothing."""
