"""The broker's role in its group: master or slave, from an election in etcd (issue 9).

With `replication` "none" the broker is a static master as before issue 9
(role "", no election, no replication port). Otherwise every member of the
group `{cluster}/{name}` is a candidate in the election at
`{etcd_prefix}election/brokers/{cluster}/{name}` (node id = broker id, value
= its addr, repl_addr and http_addr), and `RoleManager` follows it:

- leading: stop following, append (epoch, commit-log end) to the store's
  EpochLog (BEFORE the first write of the term), start the ReplicationServer
  on `repl_port`, in sync mode write the in-sync set {epoch, [itself]}
  (ferry_broker.insync), then take writes and register role "master";
- not leading: stop taking writes at once (`writable` reads the election's
  clock-checked `is_leader`, not a flag the loop might set late), stop the
  server, follow the leader's `repl_addr` at its epoch, register "slave".

`writable` is the one check of the put path (per request, not per message).

Most caught-up slave first, and in sync mode only in-sync set members: the
candidacy (ferry_broker.candidacy) decides whether this broker stands.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ferry.auth.credentials import service_credentials
from ferry.auth.tls import server_context
from ferry.errors import NotMasterError
from ferry.routing.election import Election
from ferry.store.epochs import EpochLog
from ferry.tasks import cancel_and_wait

from ferry_broker.candidacy import Candidacy
from ferry_broker.insync import InSyncSet, insync_key

if TYPE_CHECKING:
    from ferry.store import MessageStore

    from ferry_broker.config import BrokerConfig
    from ferry_broker.consumer_offsets import ConsumerOffsetManager
    from ferry_broker.registration import Registration
    from ferry_broker.replication.admission import SlaveAuth
    from ferry_broker.replication.follower import ReplicaFollower
    from ferry_broker.replication.master import ReplicationServer

log = logging.getLogger(__name__)

ROLE_NONE, ROLE_MASTER, ROLE_SLAVE = "", "master", "slave"
#: How often the election polls etcd as a standby (a takeover waits at most this
#: after the old lease ends).
ELECTION_POLL_S = 0.5
#: How often roles are compared with the election when nothing woke the loop.
RECONCILE_S = 0.25


class RoleManager:
    """Follows the group's election: serves as master or slave, and says which."""

    def __init__(self, config: BrokerConfig, store: MessageStore,
                 offsets: ConsumerOffsetManager, notify: Callable[[str, int], object],
                 slave_auth: SlaveAuth | None = None) -> None:
        # The parts it needs, not the broker context: the context builds this manager.
        self._config, self._store, self._offsets = config, store, offsets
        self._notify = notify  # wakes the long polls of a queue (slave appends)
        self._slave_auth = slave_auth  # with auth on: judges a slave's AUTH and broker id
        self.mode = config.replication
        self.role = ROLE_NONE if self.mode == "none" else ROLE_SLAVE
        #: The term this broker leads (master) or follows (slave); 0 before any.
        self.epoch = 0
        self._master = self.mode == "none"
        self.election: Election | None = None
        self.server: ReplicationServer | None = None
        self.follower: ReplicaFollower | None = None
        self.epochs: EpochLog | None = None
        self._following: tuple[str, int] | None = None
        self._registration: Registration | None = None
        self._candidacy = Candidacy(config, self.position)
        self._appended = 0  # the epoch this process appended to the epoch log last
        self._refused = 0   # the term refused for being older than the store's
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        #: Sync mode: the in-sync set this broker keeps while master.
        self.insync: InSyncSet | None = None

    # -- what the put path and the handlers read --------------------------------

    @property
    def writable(self) -> bool:
        """True while this broker may take writes: the static master, or the elected one
        whose lease is safe now (checked against the clock, per request)."""
        election = self.election
        # The epoch check: a lease lost and a new term won within one election round
        # must not let writes go on before `_lead` wrote that term's epoch entry.
        return self._master and (election is None or (election.is_leader
                                                      and election.epoch == self.epoch))

    def not_master(self) -> NotMasterError:
        """The error a write gets on a broker that is not (or no longer) its group's master."""
        cfg = self._config
        leader = self.election.leader if self.election is not None else None
        where = f"; the master is broker {leader.node_id} at {leader.value.get('addr')}" \
            if leader is not None and leader.node_id != str(cfg.id) else ""
        return NotMasterError(f"broker {cfg.name}/{cfg.id} is not the master "
                              f"(role {self.role or 'none'}, epoch {self.epoch}){where}")

    def require_master(self) -> None:
        """Refuse a write request on a broker that is not its group's master (before any
        work)."""
        if not self.writable:
            raise self.not_master()

    def confirmed_offset(self) -> int | None:
        """On a sync master: the commit-log offset below which every in-sync slave has the
        records (the log end while the set is the master alone); None elsewhere.

        PULL serves a sync master's records only below it (Kafka's high watermark): a
        record a consumer saw is then on every member that may be elected, so a failover
        can neither take it back nor write another record at its queue offset (which the
        consumer, already past that offset, would skip)."""
        server = self.server
        if server is None or self.mode != "sync":
            return None
        return server.confirmed_offset

    @property
    def replicating(self) -> bool:
        return self.mode != "none"

    def has_live_slave(self) -> bool:
        """A master with at least one connected slave that is not lagging."""
        server = self.server
        return server is not None and any(not s.get("lagging") for s in server.slaves())

    def position(self) -> tuple[int, int]:
        """(last epoch of the epoch log, commit-log end): how caught up this store is."""
        last = self.epochs.last if self.epochs is not None else None
        return (last[0] if last else 0, self._store.commit_log_max_offset)

    def status(self) -> dict[str, Any]:
        """The "replication" section of /v1/stats."""
        end_offset = self._store.commit_log_max_offset
        out: dict[str, Any] = {"mode": self.mode, "role": self.role, "epoch": self.epoch,
                               "end_offset": end_offset, "writable": self.writable}
        if self.election is not None and self.election.leader is not None:
            out["leader"] = {"id": self.election.leader.node_id,
                             "epoch": self.election.leader.epoch,
                             **self.election.leader.value}
        if self.role == ROLE_MASTER and self.server is not None:
            out["slaves"] = self.server.slaves()
            if self.insync is not None:
                out["insync"] = self.insync.status()
        elif self.follower is not None and self._following is not None:
            out["follower"] = self.follower.status()
        return out

    # -- start / stop -------------------------------------------------------------

    async def start(self, registration: Registration) -> None:
        """Join the election (once registration reached etcd); nothing for mode "none"."""
        if not self.replicating:
            return
        from ferry_broker.replication.follower import ReplicaFollower

        cfg = self._config
        if registration.registry is None:
            raise RuntimeError("replication needs etcd")
        self._registration = registration
        self.epochs = EpochLog(str(cfg.data_path))
        self._store.histories.use_epochs(self.epochs)  # master terms are histories (issue 16)
        self.follower = ReplicaFollower(
            self._store, self.epochs, cluster=cfg.cluster, name=cfg.name, broker_id=cfg.id,
            on_append=self._on_append, on_offsets=self._on_offsets,
            credentials=service_credentials("broker"))
        self.election = Election(
            registration.registry, None, f"election/brokers/{cfg.cluster}/{cfg.name}",
            str(cfg.id), {"addr": cfg.addr, "repl_addr": cfg.repl_addr,
                          "http_addr": cfg.http_addr},
            cfg.election_ttl_s, eligible=self._candidacy.eligible,
            on_change=lambda _leading: self._wake.set(), poll_s=ELECTION_POLL_S)
        if self.mode == "sync":
            self.insync = InSyncSet(
                self.election, insync_key(registration.registry.prefix, cfg.cluster, cfg.name),
                cfg.id, cfg.min_insync_replicas, cfg.repl_timeout_ms)
        self._candidacy.attach(self.election, self.insync)
        await self.election.start()
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._run(), name="roles"),
                       loop.create_task(self._candidacy.publish_loop(), name="replica-position")]
        log.info("replication %s: candidate in %s", self.mode, self.election.key.decode())

    async def stop(self) -> None:
        """Stop taking writes, resign (the key goes at once: a slave takes over now).

        Without replication nothing changes: a lone broker drains its requests
        as before (there is nobody to hand writes to)."""
        if not self.replicating:
            return
        self._master = False
        for task in self._tasks:
            await cancel_and_wait(task)
        self._tasks = []
        if self.insync is not None:
            await self.insync.end()
        if self.election is not None:
            await self.election.stop()
        if self.server is not None:
            await self.server.stop()
            self.server = None
        if self.follower is not None:
            await self.follower.stop()
            self._following = None

    # -- following the election ---------------------------------------------------

    async def _run(self) -> None:
        while True:
            try:
                await self._reconcile()
            except Exception:  # a bug or a port in use: log, try again next round
                log.exception("role change failed; retrying")
            self._wake.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wake.wait(), RECONCILE_S)

    async def _reconcile(self) -> None:
        election = self.election
        assert election is not None
        if election.is_leader:
            if not self._master:
                await self._lead(election.epoch)
            return
        if self.role == ROLE_MASTER or self.server is not None:
            # (A server without the role: the term ended while `_lead` was starting it.)
            await self._step_down()
        leader = election.leader
        if leader is None:
            return  # no leader right now: keep following the last one (it may return)
        self._candidacy.declined = 0
        if leader.node_id == str(self._config.id):
            return  # our own key from before a restart: its lease ends soon
        repl_addr = str(leader.value.get("repl_addr") or "")
        if not repl_addr:
            log.warning("leader %s announces no repl_addr", leader.node_id)
            return
        if self._following != (repl_addr, leader.epoch):
            assert self.follower is not None
            await self.follower.follow(repl_addr, leader.epoch, int(leader.node_id))
            self._following = (repl_addr, leader.epoch)
            self.epoch = leader.epoch
            log.info("slave of %s (broker %s) in epoch %d", repl_addr, leader.node_id,
                     leader.epoch)
            self._announce()

    async def _lead(self, epoch: int) -> None:
        """Become master of `epoch`: the epoch log first, then the server, then writes."""
        cfg = self._config
        assert self.epochs is not None and self.election is not None
        if self.follower is not None and self._following is not None:
            await self.follower.stop()
            self._following = None
        last = self.epochs.last
        if last is not None and (last[0] > epoch
                                 or (last[0] == epoch and self._appended != epoch)):
            # etcd lost its epoch key (a new etcd, a wiped prefix): refuse to reuse a
            # term this store already has; an operator must look (docs/replication.md).
            if self._refused != epoch:  # said once per term, not every round
                log.error("elected with epoch %d but this store already has epoch %d: not "
                          "taking writes", epoch, last[0])
                self._refused = epoch
            return
        if last is None or last[0] != epoch:
            await asyncio.to_thread(self.epochs.append, epoch, self._store.commit_log_max_offset)
            self._appended = epoch
        # The term is ours from here (writes still wait for `_master`): a slave that
        # links at once says this epoch, and the server must not think it newer.
        self.epoch = epoch
        if self.server is None:
            from ferry_broker.replication.master import ReplicationServer

            server = ReplicationServer(
                self._store, self.epochs, cluster=cfg.cluster, name=cfg.name, broker_id=cfg.id,
                epoch=lambda: self.epoch, is_peer=self._is_peer,
                offsets=self._offsets,
                lag_bytes_max=cfg.repl_lag_bytes_max, listener=self.insync,
                auth=self._slave_auth, handshake_timeout_ms=cfg.repl_handshake_timeout_ms)
            await server.start(cfg.host, cfg.repl_port,
                               server_context(cfg.tls_cert, cfg.tls_key))
            self.server = server
        if self.insync is not None and not await self.insync.begin(epoch, self.server):
            return  # the set is not written (etcd away, or the term lost): next round
        if not (self.election.is_leader and self.election.epoch == epoch):
            return  # lost it meanwhile: the next round steps down
        if lowered := self._offsets.clamp(self._store.max_offset):
            log.warning("%d consumer offsets were past this store's queue ends: lowered to "
                        "them (re-delivery, never a skip)", lowered)
        self.role, self._master = ROLE_MASTER, True
        log.info("master of %s/%s in epoch %d from offset %d", cfg.cluster, cfg.name, epoch,
                 self._store.commit_log_max_offset)
        self._announce()

    async def _step_down(self) -> None:
        self._master = False
        if self.role == ROLE_MASTER:
            log.warning("no longer master (epoch %d)", self.epoch)
        self.role = ROLE_SLAVE
        if self.insync is not None:
            await self.insync.end()
        if self.server is not None:
            server, self.server = self.server, None
            await server.stop()
        self._announce()

    def _announce(self) -> None:
        if self._registration is not None:
            self._registration.set_role(self.role, self.epoch)

    # -- the replication link's callbacks -----------------------------------------

    def _is_peer(self, broker_id: int) -> bool:
        """A slave may connect if it is a live registered broker of this group."""
        cfg = self._config
        if broker_id == cfg.id:
            return False
        cache = self._registration.cache if self._registration is not None else None
        return cache is not None and (cfg.cluster, cfg.name, broker_id) in cache.brokers

    def _on_append(self, queues: set[tuple[str, int]]) -> None:
        notify = self._notify
        for topic, queue_id in queues:
            notify(topic, queue_id)

    def _on_offsets(self, raw: bytes) -> None:
        try:
            self._offsets.merge_snapshot(raw, self._store.max_offset)
        except Exception as exc:  # the master's bug must not stop following
            log.warning("ignoring the master's consumer offsets: %s", exc)
