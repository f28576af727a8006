"""Leader election through etcd: one lease, one create-if-absent key.

Every instance holds a lease (TTL `ttl_s`) and tries to create
`<prefix>leaders/delay-scheduler` = {"id", "http_addr"} under it in one
transaction (compare create_revision == 0). The instance that created it
leads until its lease ends: it stopped (the key is deleted), it died (the
lease expires after the TTL), or it could not refresh the lease for 2/3 of
the TTL (it steps down by itself, before etcd gives the key away, so that two
instances never pull at once). The others retry every second.

Fencing: `leads()` is the check the scheduler makes right before it hands out
due messages and before each DELIVER_DUE frame leaves. It is true only while
this instance leads and the last lease grant or refresh was SENT less than 2/3
of the TTL ago: etcd cannot let the lease expire (and another instance take
the key) before that send time plus the TTL, so the last frame a deposed leader
sends leaves at least TTL/3 before a new leader can exist. `epoch` is the etcd
revision that created the leader key: it grows with every term (logged, shown
in /v1/stats).
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time

from ferry.routing import EtcdRegistry, EtcdUnavailable

log = logging.getLogger(__name__)

LEADER_KEY = "leaders/delay-scheduler"
STANDBY_POLL_S = 1.0
SAFE_SHARE = 2 / 3  # of the TTL, after a refresh was sent, that a leader may act


class LeaderElection:
    """Runs the election loop; `is_leader` and `leader_addr` say how it stands."""

    def __init__(self, endpoints: str, prefix: str, node_id: str, http_addr: str,
                 ttl_s: int) -> None:
        self.registry = EtcdRegistry(endpoints, prefix=prefix)
        self.key = f"{self.registry.prefix}{LEADER_KEY}".encode()
        self.node_id = node_id
        self.http_addr = http_addr
        self.ttl_s = ttl_s
        self.is_leader = False
        self.leader_addr = ""
        self.leader_id = ""
        self._lease_id: int | None = None
        self._connected = False
        self._last_refresh = 0.0  # send time of the last successful grant or refresh
        self.epoch = 0
        self._value = json.dumps({"id": node_id, "http_addr": http_addr}).encode()

    async def run(self) -> None:
        """Forever: connect, keep the lease, take or watch the leadership."""
        while True:
            try:
                if not self._connected:
                    await self.registry.start()
                    self._connected = True
                await self._round()
            except (*EtcdUnavailable, ConnectionError) as exc:
                log.warning("etcd unavailable for the election (%s)", exc)
                self._check_expiry()
                with contextlib.suppress(Exception):
                    await self.registry.failover()
            await asyncio.sleep(self.ttl_s / 3 if self.is_leader else STANDBY_POLL_S)

    async def _round(self) -> None:
        client = self.registry.client
        if self._lease_id is not None:
            sent = time.monotonic()
            reply = await asyncio.wait_for(client.refresh_lease(self._lease_id), self.ttl_s / 3)
            if reply is None or reply.TTL <= 0:
                self._lease_id = None
                if self.is_leader:
                    self._step_down("lease lost")
            else:
                self._last_refresh = sent
        if self._lease_id is None:
            sent = time.monotonic()
            lease = await client.lease(self.ttl_s)
            self._lease_id, self._last_refresh = lease.id, sent
        if self.is_leader:
            return
        tx = client.transactions
        ok, responses = await client.transaction(
            compare=[tx.create(self.key) == 0],
            success=[tx.put(self.key, self._value, lease=self._lease_id)], failure=[])
        if ok:
            self.is_leader, self.leader_addr, self.leader_id = True, self.http_addr, self.node_id
            self.epoch = int(responses[0].response_put.header.revision)
            log.info("leader now", extra={"node": self.node_id, "http_addr": self.http_addr,
                                          "epoch": self.epoch})
            return
        got = await client.get(self.key)
        if got is not None:
            try:
                value = json.loads(got.value)
                self.leader_addr, self.leader_id = str(value["http_addr"]), str(value["id"])
            except (ValueError, KeyError, TypeError):
                self.leader_addr = self.leader_id = ""

    def leads(self) -> bool:
        """The fence: leading, and the last refresh was sent less than 2/3 TTL ago (a
        leader past that steps down here, even while its loop waits on etcd)."""
        self._check_expiry()
        return self.is_leader

    def _check_expiry(self) -> None:
        """Without etcd, give up leading before the lease can expire there."""
        if self.is_leader and time.monotonic() - self._last_refresh > self.ttl_s * SAFE_SHARE:
            self._step_down("lease not refreshed for 2/3 of its TTL")

    def _step_down(self, why: str) -> None:
        # The lease is left to expire (no more refreshes): the key goes with it, for
        # the next term, even if this instance's own key could still be refreshed.
        self._lease_id = None
        self.is_leader = False
        self.leader_addr = self.leader_id = ""
        log.warning("no longer leader: %s", why, extra={"node": self.node_id})

    async def stop(self) -> None:
        """Resign (revoke the lease: the key goes at once) and close the connection."""
        lease, self._lease_id = self._lease_id, None
        self.is_leader = False
        if lease is not None and self._connected:
            with contextlib.suppress(*EtcdUnavailable, ConnectionError, RuntimeError):
                await asyncio.wait_for(self.registry.client.revoke_lease(lease), 2.0)
        await self.registry.stop()
