"""The in-sync set of a sync broker group (issue 9): who has every acknowledged write.

RocketMQ 5's SyncStateSet, Kafka's ISR with min.insync.replicas. The set lives
in etcd at `{etcd_prefix}insync/brokers/{cluster}/{name}` =
{"epoch": E, "members": [broker ids, the master first]} and only the current
leader writes it, with `Election.put_if_leader` (a transaction comparing the
leader key's create_revision), so a deposed master never can.

- A new master writes {"epoch": E, "members": [itself]} before its first write
  of the term (`InSyncSet.begin`).
- A slave joins in two steps once its acknowledged offset is within
  CAUGHT_UP_LAG_BYTES of the master's log end E (moment P): the master counts
  it in the sync waits from P on, waits until it acknowledged E (every write
  acked before P ended at or below E), and only then writes the bigger set.
  So once etcd lists the slave (it may be elected), it has every acknowledged
  write. Requiring the exact end instead would never let a slave in under a
  steady load; if it does not reach E within `repl_timeout_ms`, the writes
  waiting for it time out and it is dropped (it tries again later).
- A set slave that unlinks, or that had not acknowledged a write when the
  write's wait timed out (`repl_timeout_ms`), leaves the set: the smaller set is
  written to etcd FIRST, and only then do the waits stop counting it (so a
  write acked without it was never acked while etcd still listed it as
  electable). If that write fails, nothing it holds up is acked: the waits
  time out with SlaveNotAvailableError.
- With fewer members than `min_insync_replicas` (master included), sync writes
  answer SlaveNotAvailableError at once.
- In sync mode a candidate may lead only if the key is absent or lists it
  (`may_lead`): an out-of-sync slave is never elected (RocketMQ's
  enableElectUncleanMaster = false). Async groups do not use the set.

All of this runs on the event loop; the put path only reads the server's
required set (one frozenset per write) and the waiters' heap.
"""
from __future__ import annotations

import asyncio
import json
import logging
from typing import TYPE_CHECKING, Any

from ferry.errors import SlaveNotAvailableError
from ferry.routing.election import Election
from ferry.service.lifecycle import cancel_and_wait

if TYPE_CHECKING:
    from ferry_broker.replication.master import ReplicationServer

log = logging.getLogger(__name__)

#: Where a group's set lives under the etcd prefix.
INSYNC_KEY = "insync/brokers/{cluster}/{name}"
#: Pause before writing the set again after etcd failed or refused the write.
WRITE_RETRY_S = 0.5
#: A slave that failed to join (it did not reach the end in time) tries again only
#: after this: each failed try costs the writes that waited for it a timeout.
JOIN_RETRY_S = 5.0


def insync_key(prefix: str, cluster: str, name: str) -> bytes:
    """The etcd key of group `cluster`/`name`'s in-sync set."""
    prefix = prefix if prefix.endswith("/") else prefix + "/"
    return (prefix + INSYNC_KEY.format(cluster=cluster, name=name)).encode()


def parse_members(raw: bytes) -> list[int]:
    """The member ids of a stored set; ValueError when it is not one."""
    doc = json.loads(raw)
    if not isinstance(doc, dict) or not isinstance(doc.get("members"), list):
        raise ValueError(f"not an in-sync set: {raw[:100]!r}")
    return [int(m) for m in doc["members"]]


async def read_members(election: Election, key: bytes) -> list[int] | None:
    """The set's members as etcd has them now; None when the key is absent."""
    got = await election.registry.client.get(key)
    return None if got is None else parse_members(got.value)


async def may_lead(election: Election, key: bytes, broker_id: int) -> tuple[bool, list[int] | None]:
    """(whether `broker_id` may stand for master, the members read). The hard rule
    of sync mode: the key is absent or lists it. etcd unreadable or the value
    unreadable: it may not (an unclean election could lose acknowledged writes)."""
    try:
        members = await read_members(election, key)
    except Exception as exc:
        log.warning("cannot read the in-sync set (%s): not standing for master", exc)
        return False, None
    return members is None or broker_id in members, members


class InSyncSet:
    """The master's keeper of its group's in-sync set, for one term at a time.

    It is the ReplicationServer's listener (caught up, unlinked, lagging) and
    tells the server which slaves the sync waits need (`set_required`)."""

    def __init__(self, election: Election, key: bytes, broker_id: int,
                 min_insync_replicas: int, repl_timeout_ms: int) -> None:
        self._election = election
        self.key = key
        self.broker_id = broker_id
        self.min_insync_replicas = min_insync_replicas
        self.repl_timeout_ms = repl_timeout_ms
        self.epoch = 0
        #: The members etcd has (as last written by this master); [] outside a term.
        self.members: list[int] = []
        self._want: set[int] = set()   # the slaves counted in waits (members or joining)
        self._ready: set[int] = set()  # joining slaves that have every acked write
        # Members a write in flight (or one whose outcome is unknown: it raised) may have
        # put in etcd: counted in waits until a write is known to have landed.
        self._maybe_listed: set[int] = set()
        self._joins: set[asyncio.Task[None]] = set()
        self._retry_at: dict[int, float] = {}   # failed joiner -> loop time of its next try
        self._server: ReplicationServer | None = None
        self._dirty = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    # -- a term -------------------------------------------------------------------------

    async def begin(self, epoch: int, server: ReplicationServer) -> bool:
        """Write {"epoch", "members": [this broker]} for a new term; True once done."""
        if self._server is not None and self.epoch == epoch:
            return True
        await self.end()
        members = [self.broker_id]
        try:
            ok = await self._write(epoch, members)
        except Exception as exc:
            log.warning("cannot write the in-sync set for epoch %d: %s", epoch, exc)
            return False
        if not ok:
            return False
        self.epoch, self.members, self._server = epoch, members, server
        self._want, self._ready, self._maybe_listed = set(), set(), set()
        self._apply()
        self._task = asyncio.get_running_loop().create_task(self._writer(), name="insync")
        log.info("in-sync set of epoch %d: %s", epoch, members)
        return True

    async def end(self) -> None:
        """The term ended: stop writing the set (the next master writes its own)."""
        task, self._task = self._task, None
        await cancel_and_wait(task)
        for join in list(self._joins):
            join.cancel()
        self._server, self.members, self._want, self._ready = None, [], set(), set()
        self._maybe_listed = set()

    def status(self) -> dict[str, Any]:
        """The set for /v1/stats: as etcd has it, plus slaves counted but not yet written."""
        return {"epoch": self.epoch, "members": list(self.members),
                "joining": sorted(self._want - set(self.members)),
                "leaving": sorted(set(self.members) - self._want - {self.broker_id}),
                "min_insync_replicas": self.min_insync_replicas}

    # -- the server's events (InSyncListener) -------------------------------------------

    def caught_up(self, broker_id: int) -> None:
        if self._server is None or broker_id in self._want:
            return
        loop = asyncio.get_running_loop()
        if loop.time() < self._retry_at.get(broker_id, 0.0):
            return
        end = self._server.store.commit_log_max_offset
        log.info("slave %d caught up: joining the in-sync set once it has offset %d",
                 broker_id, end)
        self._want.add(broker_id)
        self._apply()   # counted in waits from now on, before etcd lists it
        join = loop.create_task(self._join(broker_id, end), name=f"insync-join-{broker_id}")
        self._joins.add(join)
        join.add_done_callback(self._joins.discard)

    async def _join(self, broker_id: int, end_offset: int) -> None:
        """Once the joining slave has `end_offset` (all acked before it joined): write it."""
        server = self._server
        assert server is not None
        try:
            await server.wait_replicated(end_offset, self.repl_timeout_ms, enforce_min=False)
        except SlaveNotAvailableError as exc:
            if broker_id in self._want and broker_id not in self.members:
                log.info("slave %d did not join the in-sync set (%s); next try in %.0f s",
                         broker_id, exc, JOIN_RETRY_S)
                self._want.discard(broker_id)
                self._ready.discard(broker_id)
                self._retry_at[broker_id] = asyncio.get_running_loop().time() + JOIN_RETRY_S
                self._apply()
            return
        if server is self._server and broker_id in self._want:
            self._ready.add(broker_id)
            self._dirty.set()

    def unlinked(self, broker_id: int) -> None:
        self._leave([broker_id], "unlinked")

    def lagging(self, broker_ids: list[int]) -> None:
        gone = self._leave(broker_ids, "did not acknowledge within repl_timeout_ms")
        retry_at = asyncio.get_running_loop().time() + JOIN_RETRY_S
        for broker_id in gone:   # each try costs waiting writes a timeout: not at once
            self._retry_at[broker_id] = retry_at

    def _leave(self, broker_ids: list[int], why: str) -> list[int]:
        gone = [i for i in broker_ids if i in self._want]
        if self._server is None or not gone:
            return []
        log.warning("slave(s) %s leave the in-sync set: %s", gone, why)
        self._want.difference_update(gone)
        self._ready.difference_update(gone)
        self._apply()   # a member etcd lists stays counted until etcd has the smaller set
        self._dirty.set()
        return gone

    # -- keeping etcd and the waits in step ----------------------------------------------

    def _apply(self) -> None:
        """Waits need every member etcd may list: the written ones and the joining ones."""
        if self._server is not None:
            required = (set(self.members) | self._maybe_listed | self._want) - {self.broker_id}
            self._server.set_required(required, self.min_insync_replicas - 1)

    async def _write(self, epoch: int, members: list[int]) -> bool:
        value = json.dumps({"epoch": epoch, "members": members}).encode()
        return await self._election.put_if_leader(self.key, value)

    async def _writer(self) -> None:
        """Write the wanted set whenever it differs from etcd's, one write at a time."""
        while True:
            await self._dirty.wait()
            self._dirty.clear()
            target = [self.broker_id, *sorted(i for i in self._want
                                              if i in self.members or i in self._ready)]
            if target == self.members and self._maybe_listed <= set(target):
                self._apply()
                continue
            # Until this write is known to have landed, etcd may list `target`: a slave of
            # it that leaves meanwhile must still be waited for (else writes would be
            # acknowledged without a member etcd lets stand for master).
            self._maybe_listed |= set(target)
            try:
                ok = await self._write(self.epoch, target)
            except Exception as exc:   # outcome unknown: it may have landed
                log.warning("cannot write the in-sync set %s: %s", target, exc)
                ok = False
            if not ok:   # etcd away, or no longer leader (the roles loop steps down)
                await asyncio.sleep(WRITE_RETRY_S)
                self._dirty.set()
                continue
            self.members = target
            self._maybe_listed = set()
            self._ready.difference_update(target)
            log.info("in-sync set of epoch %d: %s", self.epoch, target)
            self._apply()
