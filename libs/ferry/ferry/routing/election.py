"""Leader election through etcd, with epochs (fencing tokens) and a safe-until bound.

Every candidate holds a lease (TTL `ttl_s`) and tries to create the leader key
`<prefix><key>` = {**value, "id", "epoch"} under it. The create and the epoch
bump are ONE transaction:

    compare: create_revision(<key>) == 0  AND  mod_revision(<key>/epoch) == seen
    success: put <key> (with the lease), put <key>/epoch = seen epoch + 1

so two terms never share an epoch and epochs only grow: the epoch lives in
etcd without a lease and survives leaders, candidates and etcd restarts.

A leader leads until its lease ends: it stopped (the lease is revoked, the key
goes at once), it died (the lease expires after the TTL), or it could not
refresh the lease in time. `safe_until` is the monotonic time up to which it
may act as leader: the SEND time of the last successful keep-alive (or grant)
plus 2/3 of the TTL. etcd cannot expire the lease before the send time plus
the TTL, so a leader that stops acting at `safe_until` (`is_leader` turns
False by itself then, even if the loop is stuck) is never acting while another
node leads. That assumes clocks that run at about the same rate, not synced ones.

Candidates poll the leader key every `poll_s` (standby) and refresh the lease
every TTL/3 (leader). `eligible()` is asked before each attempt to take the
key, and only while the key is free (so a caller may count its refusals):
the broker (issue 9's "the most caught-up slave becomes master") makes a
lagging candidate wait a few rounds while a better one is alive; it only
delays a takeover, safety does not depend on it.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aetcd.exceptions

from ferry.routing.registry import EtcdRegistry, EtcdUnavailable

log = logging.getLogger("ferry.routing.election")

DEFAULT_POLL_S = 1.0
MIN_TTL_S = 2  # etcd raises shorter leases to about 2 s anyway
# The share of the TTL a leader may act after sending a keep-alive; the rest
# (1/3) is the margin for the reply's trip, a late loop and clock rate drift.
SAFE_SHARE = 2 / 3
# Fields the election adds to the leader's value.
RESERVED_FIELDS = ("id", "epoch")


@dataclass(frozen=True)
class LeaderInfo:
    """The current leader as read from etcd: its id, its term's epoch and its value."""

    node_id: str
    epoch: int
    value: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, raw: bytes) -> LeaderInfo:
        doc = json.loads(raw)
        if not isinstance(doc, dict):
            raise ValueError("leader value is not an object")
        value = {k: v for k, v in doc.items() if k not in RESERVED_FIELDS}
        return cls(str(doc["id"]), int(doc.get("epoch", 0)), value)


class Election:
    """One candidate in the election for `key`; `start()` runs it, `stop()` resigns.

    `registry_or_endpoints` is an `EtcdRegistry` to share (not stopped here;
    `prefix` None means its prefix) or an endpoints string (a registry of its own).
    `on_change(is_leader)` is called when this node's role changes.
    """

    def __init__(self, registry_or_endpoints: EtcdRegistry | str, prefix: str | None,
                 key: str, node_id: str, value: dict[str, Any], ttl_s: int, *,
                 eligible: Callable[[], Awaitable[bool]] | None = None,
                 on_change: Callable[[bool], None] | None = None,
                 poll_s: float = DEFAULT_POLL_S) -> None:
        if ttl_s < MIN_TTL_S:
            raise ValueError(f"ttl_s must be at least {MIN_TTL_S}, got {ttl_s}")
        if clash := [k for k in RESERVED_FIELDS if k in value]:
            raise ValueError(f"value must not hold the election's own fields {clash}")
        if isinstance(registry_or_endpoints, EtcdRegistry):
            self.registry, self._owns_registry = registry_or_endpoints, False
            prefix = registry_or_endpoints.prefix if prefix is None else prefix
        else:
            self.registry = EtcdRegistry(registry_or_endpoints, prefix=prefix or "/ferry/")
            self._owns_registry = True
        prefix = self.registry.prefix if prefix is None else prefix
        prefix = prefix if prefix.endswith("/") else prefix + "/"
        self.key = f"{prefix}{key}".encode()
        self.epoch_key = self.key + b"/epoch"
        self.node_id, self.value, self.ttl_s = node_id, dict(value), math.ceil(ttl_s)
        self.poll_s = poll_s
        self._eligible, self._on_change = eligible, on_change
        #: The leader as last seen (self when leading); None when none is known.
        self.leader: LeaderInfo | None = None
        #: Monotonic time until which this node may act as leader (0 when it is not).
        self.safe_until = 0.0
        self._leading = False
        self._lease_id: int | None = None
        self._lease_sent = 0.0  # send time of the last successful grant or keep-alive
        self._created_rev = 0  # create_revision of our leader key while leading
        self._connected = False
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._changed = asyncio.Event()

    # -- state -------------------------------------------------------------------

    @property
    def is_leader(self) -> bool:
        """True while this node leads and may act so (checked against the clock now)."""
        return self._leading and time.monotonic() < self.safe_until

    @property
    def epoch(self) -> int:
        """The epoch of the leader as last seen (this node's term when leading), 0 if none."""
        return self.leader.epoch if self.leader is not None else 0

    @property
    def lease_id(self) -> int | None:
        """The candidate's current lease (None between leases): keys put under it
        vanish when this candidate stops or dies, as its leader key does."""
        return self._lease_id

    async def wait_leader(self) -> LeaderInfo:
        """Wait until some leader (maybe this node) is known; return it."""
        while self.leader is None:
            await self.wait_change()
        return self.leader

    async def wait_leading(self) -> None:
        """Wait until this node leads."""
        while not self.is_leader:
            await self.wait_change()

    async def wait_change(self) -> None:
        """Wait for the next round's news (or at most `poll_s`): for followers of `leader`."""
        self._changed.clear()
        with contextlib.suppress(asyncio.TimeoutError):
            # The timeout catches a safe_until passing without a loop round.
            await asyncio.wait_for(self._changed.wait(), self.poll_s)

    def _set(self, leading: bool, leader: LeaderInfo | None, why: str = "") -> None:
        was = self._leading
        self._leading, self.leader = leading, leader
        if not leading:
            self.safe_until = 0.0
        self._changed.set()
        if was != leading:
            if leading:
                log.info("leader now", extra={"node": self.node_id, "epoch": self.epoch,
                                              "key": self.key.decode()})
            else:
                log.warning("no longer leader: %s", why, extra={"node": self.node_id})
            if self._on_change is not None:
                try:
                    self._on_change(leading)
                except Exception:  # a callback's bug must not stop the election
                    log.exception("election on_change callback failed")

    # -- start / stop ------------------------------------------------------------

    async def start(self) -> None:
        """Run the election in a task (connecting to etcd when it answers)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name=f"election-{self.key.decode()}")

    async def stop(self) -> None:
        """Resign (revoke the lease: the key goes at once) and stop."""
        task, self._task = self._task, None
        self._stopping = True
        await _cancel_bounded(task)
        self._set(False, None, "stopped")
        await self._drop_lease()
        if self._owns_registry:
            await self.registry.stop()

    async def __aenter__(self) -> Election:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # -- the loop ----------------------------------------------------------------

    async def _run(self) -> None:
        while not self._stopping:
            client = None
            try:
                if not self._connected:
                    if self._owns_registry:
                        await self.registry.start()
                    self._connected = True
                # A shared registry that its owner has not started yet raises
                # RuntimeError here: wait for it like for an etcd that is away.
                client = self.registry.client
                await self._round()
            except (*EtcdUnavailable, ConnectionError, RuntimeError) as exc:
                log.warning("etcd unavailable for the election of %s (%s)",
                            self.key.decode(), exc)
                if client is not None:
                    # Only the client that failed: a shared registry's other users
                    # (and a failover they made already) are left alone.
                    with contextlib.suppress(Exception):
                        await self.registry.failover(client)
            except Exception:  # a bug or an odd reply: log it, never end the election
                log.exception("election round of %s failed", self.key.decode())
            await self._sleep()

    async def _sleep(self) -> None:
        """Sleep until the next round, waking to step down at safe_until."""
        interval_s = self.ttl_s / 3 if self._leading else self.poll_s
        if self._leading:
            left_s = self.safe_until - time.monotonic()
            if left_s < interval_s:
                await asyncio.sleep(max(0.0, left_s))
                if time.monotonic() >= self.safe_until:
                    await self._abandon("lease not refreshed within 2/3 of its TTL")
                return
        await asyncio.sleep(interval_s)

    async def _round(self) -> None:
        if self._leading and time.monotonic() >= self.safe_until:
            await self._abandon("lease not refreshed within 2/3 of its TTL")
        await self._keep_lease()
        if self._leading:
            await self._check_key()
        else:
            await self._campaign()

    async def _keep_lease(self) -> None:
        client = self.registry.client
        if self._lease_id is not None:
            sent = time.monotonic()
            reply = await asyncio.wait_for(client.refresh_lease(self._lease_id), self.ttl_s / 3)
            if reply is None or reply.TTL <= 0:
                self._lease_id = None
                if self._leading:
                    self._set(False, None, "lease lost")
            else:
                self._lease_sent = sent
                if self._leading:
                    self.safe_until = sent + self.ttl_s * SAFE_SHARE
        if self._lease_id is None:
            sent = time.monotonic()
            lease = await asyncio.wait_for(client.lease(self.ttl_s), self.ttl_s / 3)
            self._lease_id, self._lease_sent = lease.id, sent

    async def _campaign(self) -> None:
        """Try to take the key (epoch + 1 in the same transaction); else note the leader."""
        client = self.registry.client
        tx = client.transactions
        # While a leader holds the key there is nothing to try: `eligible` is asked
        # only when the key is free, so that a caller may count its refusals.
        if await self._observe():
            return
        got = await client.get(self.epoch_key)
        seen_rev = got.mod_revision if got is not None else 0
        seen_epoch = _parse_epoch(got.value) if got is not None else 0
        if self._eligible is not None and not await self._eligible():
            await self._observe()
            return
        epoch = seen_epoch + 1
        value = json.dumps({**self.value, "id": self.node_id, "epoch": epoch}).encode()
        try:
            ok, responses = await client.transaction(
                compare=[tx.create(self.key) == 0, tx.mod(self.epoch_key) == seen_rev],
                success=[tx.put(self.key, value, lease=self._lease_id),
                         tx.put(self.epoch_key, str(epoch).encode())],
                failure=[])
        except aetcd.exceptions.ClientError as exc:
            if "lease not found" not in str(exc):
                raise
            self._lease_id = None  # expired between refresh and campaign: next round
            return
        if not ok:
            await self._observe()
            return
        self._created_rev = int(responses[0].response_put.header.revision)
        self.safe_until = self._lease_sent + self.ttl_s * SAFE_SHARE
        self._set(True, LeaderInfo(self.node_id, epoch, dict(self.value)))

    async def put_if_leader(self, key: bytes | str, value: bytes) -> bool:
        """Put `key` = `value` only while this node's leader key is still the one it
        created (one etcd transaction): a deposed leader, whose key was replaced or
        expired, can never write it. True when written. No lease: the key outlives
        the term (the broker's in-sync set, issue 9)."""
        if not self._leading or self._created_rev == 0:
            return False
        client = self.registry.client
        tx = client.transactions
        raw_key = key.encode() if isinstance(key, str) else key
        ok, _ = await client.transaction(
            compare=[tx.create(self.key) == self._created_rev],
            success=[tx.put(raw_key, value)], failure=[])
        return bool(ok)

    async def _observe(self) -> bool:
        """Note the leader as etcd has it now; True when the key is held (even unreadable)."""
        got = await self.registry.client.get(self.key)
        leader = None
        if got is not None:
            try:
                leader = LeaderInfo.from_json(got.value)
            except (ValueError, KeyError, TypeError) as exc:
                log.warning("invalid leader value at %s: %s", self.key.decode(), exc)
        self._set(False, leader)
        return got is not None

    async def _check_key(self) -> None:
        """A leader whose key was deleted or replaced behind its back steps down."""
        got = await self.registry.client.get(self.key)
        if got is None or got.create_revision != self._created_rev:
            await self._abandon("leader key deleted or replaced")

    async def _abandon(self, why: str) -> None:
        """Step down and drop the lease, so that the key is freed for a new term."""
        self._set(False, None, why)
        await self._drop_lease()

    async def _drop_lease(self) -> None:
        lease, self._lease_id = self._lease_id, None
        if lease is not None and self._connected:
            with contextlib.suppress(*EtcdUnavailable, ConnectionError, RuntimeError):
                await asyncio.wait_for(self.registry.client.revoke_lease(lease), 2.0)


async def _cancel_bounded(task: asyncio.Task[None] | None) -> None:
    """Cancel the election's task and wait for its end, cancelling again while it
    runs on: Python 3.11's `wait_for` can swallow a cancellation that arrives as
    its inner call completes, and the loop would then run its next round."""
    while task is not None and not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=1.0)
    if task is not None and not task.cancelled():
        with contextlib.suppress(Exception):
            task.exception()


def _parse_epoch(raw: bytes) -> int:
    try:
        return int(raw)
    except ValueError:
        # Never reuse an epoch: an unreadable one is a bug to report, not 0.
        raise ValueError(f"unreadable election epoch {raw!r}") from None
