"""Live transactional producers: which connection reaches which member of a group.

A transactional producer sends HEARTBEAT with `role` "producer" every few
seconds on the connection that should receive its checks; the broker keeps
(group, client_id) -> that connection. A producer silent for `expiry_ms`
(the consumers' expiry) is dropped, and so is every registration of a
connection when it closes, so a check is only ever pushed to a connection
that is open. `pick` hands out a group's producers in round-robin order.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ferry.wire import Frame

from ferry_broker.members import HeartbeatTable

MAX_PRODUCERS_PER_GROUP = 10_000
MAX_PRODUCER_GROUPS = 100_000

Push = Callable[[Frame], bool]
"""Sends a one-way frame on a connection; False when it could not (closed, not reading)."""


@dataclass(frozen=True)
class ProducerInfo:
    """One producer's last heartbeat and the connection it came on."""

    client_id: str
    conn_id: int
    push: Push
    last_seen_ms: float
    access_key: str = ""  # the identity its heartbeat was signed with ("" with auth off)


class ProducerManager(HeartbeatTable[ProducerInfo]):
    """Group -> client id -> ProducerInfo, with expiry and removal on disconnect."""

    def __init__(self, expiry_ms: int, clock_ms: Callable[[], float] | None = None) -> None:
        super().__init__(expiry_ms, MAX_PRODUCER_GROUPS, MAX_PRODUCERS_PER_GROUP, clock_ms)
        self._by_conn: dict[int, set[tuple[str, str]]] = {}
        self._turn: dict[str, int] = {}  # round-robin position per group

    def heartbeat(self, client_id: str, group: str, conn_id: int, push: Push,
                  access_key: str = "") -> bool:
        """Record a heartbeat; False when a limit refuses a new producer or group.

        `access_key` is the heartbeat's identity (auth on): a check-back goes only
        to a producer whose identity may publish to the half's topic.
        """
        members = self._admit(group, client_id)
        if members is None:
            return False
        old = members.get(client_id)
        if old is not None and old.conn_id != conn_id:  # it reconnected
            self._unlink(old.conn_id, group, client_id)
        members[client_id] = ProducerInfo(client_id, conn_id, push, self._clock_ms(),
                                          access_key)
        self._by_conn.setdefault(conn_id, set()).add((group, client_id))
        return True

    def connection_closed(self, conn_id: int) -> int:
        """Forget every producer registered on a closed connection; returns how many."""
        gone = self._by_conn.pop(conn_id, set())
        for group, client_id in gone:
            members = self._groups.get(group)
            if members is not None:
                info = members.get(client_id)
                if info is not None and info.conn_id == conn_id:
                    del members[client_id]
                self._drop_if_empty(group)
        return len(gone)

    def pick(self, group: str) -> list[ProducerInfo]:
        """The live producers of `group`, starting with the next one in round-robin order."""
        self._expire_group(group)
        members = self._groups.get(group)
        if not members:
            return []
        live = sorted(members.values(), key=lambda i: i.client_id)
        turn = self._turn.get(group, 0) % len(live)
        self._turn[group] = turn + 1
        return live[turn:] + live[:turn]

    def groups(self) -> dict[str, list[str]]:
        """Group -> sorted live producer client ids."""
        self.expire()
        return {g: sorted(m) for g, m in sorted(self._groups.items())}

    def _left(self, group: str, gone: list[ProducerInfo]) -> None:
        for info in gone:
            self._unlink(info.conn_id, group, info.client_id)

    def _unlink(self, conn_id: int, group: str, client_id: str) -> None:
        regs = self._by_conn.get(conn_id)
        if regs is not None:
            regs.discard((group, client_id))
            if not regs:
                del self._by_conn[conn_id]

    def _drop_if_empty(self, group: str) -> None:
        if not self._groups.get(group, True):
            self._drop_group(group)

    def _drop_group(self, group: str) -> None:
        del self._groups[group]
        self._turn.pop(group, None)
