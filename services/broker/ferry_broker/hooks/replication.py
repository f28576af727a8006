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
from ferry_broker.roles import not_master

if TYPE_CHECKING:
    from ferry_broker.context import BrokerContext


class ReplicationNotifyHook(PutHook):
    """Wakes the replication links: new records to stream."""

    def __init__(self, ctx: BrokerContext) -> None:
        self._ctx = ctx

    async def after_put(self, done: PutDone) -> None:
        server = self._ctx.roles.server
        if server is not None:
            server.notify()


class ReplicationWaitHook(PutHook):
    """Sync mode: the in-sync slaves have the records; every mode: still the master."""

    def __init__(self, ctx: BrokerContext) -> None:
        self._ctx = ctx
        self._sync = ctx.config.replication == "sync"
        self._timeout_ms = ctx.config.repl_timeout_ms

    async def after_put(self, done: PutDone) -> None:
        ctx = self._ctx
        if self._sync:
            server = ctx.roles.server
            if server is None:  # stepped down between the put and now
                raise not_master(ctx)
            await server.wait_replicated(done.end_offset, self._timeout_ms)
        if not ctx.roles.writable:
            raise not_master(ctx)


def confirmed_offset(ctx: BrokerContext) -> int | None:
    """On a sync master: the commit-log offset below which every in-sync slave has the
    records (the log end while the set is the master alone); None elsewhere.

    PULL serves a sync master's records only below it (Kafka's high watermark): a
    record a consumer saw is then on every member that may be elected, so a failover
    can neither take it back nor write another record at its queue offset (which the
    consumer, already past that offset, would skip)."""
    roles = ctx.roles
    server = roles.server
    if server is None or roles.mode != "sync":
        return None
    return server.confirmed_offset
