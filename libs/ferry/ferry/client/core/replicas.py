"""Which broker of a group a consumer reads a queue from: its master, or a slave.

A broker group is one master and its slaves (see docs/replication.md). A
queue's fetcher reads from the master, and from a slave when:

- the route names no master (the group fails over: the old master's lease
  ended and no slave has won the election yet);
- the master is unreachable (a pull to it failed with a connection error or
  timed out): for `MASTER_DOWN_MS`, then the master is tried again;
- the master's last PULL answer carried `suggest_slave: true` (this consumer
  is far behind, and reading old records from the master's disk would hurt
  its writers): until a slave answers that the queue is caught up (no record
  found), or `SUGGEST_SLAVE_MS` passed, whichever is first; then the master
  is asked again and says whether the suggestion still holds.

Slaves are tried in route order, moving to the next after a failure. With no
slave to read from, the master is used whatever its state (the pull fails
and is retried like any other). `ReadChoice` is pure state plus the clock: no
I/O, so its rules are unit tested without processes.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ferry.client.core.namesrv import BrokerRoute

#: After a failed pull to the master, read from a slave this long before trying it again.
MASTER_DOWN_MS = 3_000
#: A `suggest_slave` answer sends reads to a slave for at most this long.
SUGGEST_SLAVE_MS = 30_000


@dataclass(slots=True)
class ReadChoice:
    """The read-source state of one queue: why (and until when) it reads from a slave."""

    clock: Callable[[], float] = time.monotonic
    master_down_until: float = 0.0     # monotonic s; the master is skipped until then
    down_master: str | None = None     # the address that failed (a new master is tried at once)
    suggested_until: float = 0.0       # monotonic s; suggest_slave holds until then
    slave_index: int = 0               # which slave of the route is tried (rotates on failure)
    last_addr: str | None = field(default=None)   # where the last pull went

    def choose(self, group: BrokerRoute | None) -> str | None:
        """The address to pull from next, or None when the group has no broker at all."""
        if group is None:
            return None
        master, slaves = group.master, group.slaves
        slave = slaves[self.slave_index % len(slaves)] if slaves else None
        if slave is None:
            return master
        if master is None or self._master_down(master) or self._suggested():
            return slave
        return master

    def _master_down(self, master: str) -> bool:
        return self.down_master == master and self.clock() < self.master_down_until

    def _suggested(self) -> bool:
        return self.clock() < self.suggested_until

    def reading_from_slave(self, group: BrokerRoute | None) -> bool:
        addr = self.choose(group)
        return group is not None and addr is not None and addr != group.master

    def commit_target(self, group: BrokerRoute | None) -> str | None:
        """Where offsets go: the master, unless the group has none or the last pull to it failed.

        On a slave by suggestion only, commits still go to the master (it keeps the
        group's offsets and sends them to its slaves); with the master gone they go
        to the slave read from (the slave that becomes master keeps them).
        """
        if group is None:
            return None
        slaves = group.slaves
        if slaves and (group.master is None or self.down_master == group.master):
            return slaves[self.slave_index % len(slaves)]
        return group.master

    def on_failure(self, addr: str, group: BrokerRoute | None) -> None:
        """A pull to `addr` failed (connection lost, timeout, refused)."""
        if group is not None and addr == group.master:
            self.down_master = addr
            self.master_down_until = self.clock() + MASTER_DOWN_MS / 1000
        elif group is not None and addr in group.slaves:
            self.slave_index += 1   # the next slave (or this one again) on the next pull

    def on_answer(self, addr: str, group: BrokerRoute | None, *, found: bool,
                  suggest_slave: bool) -> None:
        """A pull to `addr` answered: `found` records, and the master's suggestion."""
        self.last_addr = addr
        if group is None:
            return
        if addr == group.master:
            self.down_master = None
            self.master_down_until = 0.0
            self.suggested_until = (self.clock() + SUGGEST_SLAVE_MS / 1000
                                    if suggest_slave and group.slaves else 0.0)
        elif not found and self._suggested():
            # Caught up on the slave: ask the master again; it suggests anew if still far behind.
            self.suggested_until = 0.0
