"""The replication hooks of the put pipeline (issue 9): wake the slaves, wait for one, fence.

Two hooks, because after-put hooks run in reverse order and the two halves
belong at both ends of it:

- `ReplicationNotifyHook` (last in the list, so first after the put): tells the
  ReplicationServer that records were put, so slaves stream them while the
  durability wait (sync flush) goes on. Both modes.
- `ReplicationWaitHook` (first in the list, so last before the ack): in sync
  mode waits until every slave of the in-sync set (ferry_broker.insync)
  acknowledged the request's end offset, at most `repl_timeout_ms` (then
  SlaveNotAvailableError, retriable: the records are stored here and may reach
  a slave later, so a retry may duplicate them; the late slaves leave the set).
  A set smaller than `min_insync_replicas` answers SlaveNotAvailableError at
  once. An ack is never sent for records a member of the set lacks, so any
  broker that may be elected has them. In every mode it then checks
  that the broker still leads: a master that lost its lease during the waits
  answers NotMasterError instead of an ack (the client retries at the new
  master; duplicates are allowed, lost acks are not).

With replication "none" neither hook is installed.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from ferry_broker.put_pipeline import PutDone, PutHook

if TYPE_CHECKING:
    from ferry_broker.config import BrokerConfig
    from ferry_broker.roles import RoleManager


class ReplicationNotifyHook(PutHook):
    """Wakes the replication links: new records to stream."""

    def __init__(self, roles: RoleManager) -> None:
        self._roles = roles

    async def after_put(self, done: PutDone) -> None:
        server = self._roles.server
        if server is not None:
            server.notify()


class ReplicationWaitHook(PutHook):
    """Sync mode: the in-sync slaves have the records; every mode: still the master."""

    def __init__(self, config: BrokerConfig, roles: RoleManager) -> None:
        self._roles = roles
        self._sync = config.replication == "sync"
        self._timeout_ms = config.repl_timeout_ms

    async def after_put(self, done: PutDone) -> None:
        roles = self._roles
        if self._sync:
            server = roles.server
            if server is None:  # stepped down between the put and now
                raise roles.not_master()
            await server.wait_replicated(done.end_offset, self._timeout_ms)
        if not roles.writable:
            raise roles.not_master()
