"""The in-sync set's waits (issue 9): real stores and links in one process, a real etcd.

A master store with a ReplicationServer whose listener is the broker's
InSyncSet, elected through a real Election: every member of the set must
acknowledge a write; a member that lets a wait time out leaves the set (in
etcd) and later writes do not wait for it; min_insync_replicas refuses at once;
a master that can no longer write the set (deposed) acknowledges nothing that
a leaving member lacks.
"""
from __future__ import annotations

import asyncio
import json
import random
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from ferry.errors import SlaveNotAvailableError
from ferry.routing import EtcdRegistry
from ferry.routing.election import Election
from ferry_broker.insync import InSyncSet, insync_key
from ferry_broker.replication import protocol as p

from tests.broker.conftest import unique_prefix
from tests.broker.repl_support import CLUSTER, NAME, Master, hello, open_master, open_slave, until
from tests.support.procs import Etcd

pytestmark = pytest.mark.integration

TTL_S = 2


@dataclass
class Group:
    master: Master
    isr: InSyncSet
    election: Election
    registry: EtcdRegistry

    async def stored(self) -> list[int]:
        got = await self.registry.client.get(self.isr.key)
        assert got is not None
        return list(json.loads(got.value)["members"])


async def _group(tmp_path: Path, etcd: Etcd, min_insync: int) -> Group:
    prefix = unique_prefix()
    registry = EtcdRegistry(etcd.endpoint, prefix=prefix)
    await registry.start()
    election = Election(registry, None, f"election/brokers/{CLUSTER}/{NAME}", "0", {}, TTL_S,
                        poll_s=0.1)
    await election.start()
    await election.wait_leading()
    isr = InSyncSet(election, insync_key(prefix, CLUSTER, NAME), 0, min_insync, 5_000)
    master = open_master(tmp_path / "master", epoch=election.epoch)
    master.listener = isr
    await master.start()
    assert master.server is not None
    assert await isr.begin(election.epoch, master.server)
    return Group(master, isr, election, registry)


@pytest.fixture
async def group(tmp_path: Path, etcd: Etcd) -> AsyncIterator[Group]:
    g = await _group(tmp_path, etcd, 1)
    yield g
    await _close(g)


async def _close(g: Group) -> None:
    await g.isr.end()
    assert g.master.server is not None
    await g.master.server.stop()
    g.master.store.close()
    await g.election.stop()
    await g.registry.stop()


async def test_every_member_must_acknowledge_and_a_late_one_leaves_the_set(
        group: Group, tmp_path: Path) -> None:
    m, isr = group.master, group.isr
    assert m.server is not None
    assert await group.stored() == [0]
    rng = random.Random(7)
    s1 = open_slave(tmp_path / "s1", 1)
    await s1.follower.follow(m.addr, m.epoch, 0)
    try:
        m.put(5, rng)
        await until(lambda: isr.members == [0, 1])
        # Slave 2 says HELLO at the master's end, acknowledges it (caught up), then hangs.
        end = m.store.commit_log_max_offset
        reader, writer = await asyncio.open_connection("127.0.0.1", m.server.port)
        try:
            writer.write(hello(2, epoch=m.epoch, end=end, entries=m.epochs.entries))
            ftype, _ = await p.read_frame(reader)
            assert ftype is p.FrameType.WELCOME
            writer.writelines(p.encode_offset(p.FrameType.ACK, end))
            await until(lambda: isr.members == [0, 1, 2])
            assert await group.stored() == [0, 1, 2]
            # Slave 1 acknowledges the next write, slave 2 does not: no ack, a timeout.
            end2 = m.put(3, rng)
            with pytest.raises(SlaveNotAvailableError):
                await m.server.wait_replicated(end2, 300)
            assert s1.store.commit_log_max_offset >= end2
            # Slave 2 leaves the set (etcd first); later writes wait for slave 1 only.
            await until(lambda: isr.members == [0, 1])
            assert await group.stored() == [0, 1]
            end3 = m.put(3, rng)
            await m.server.wait_replicated(end3, 10_000)
            assert s1.store.commit_log_max_offset >= end3
            assert {s["broker_id"]: s["in_sync"] for s in m.server.slaves()} == {1: True,
                                                                                 2: False}
        finally:
            writer.close()
    finally:
        await s1.follower.stop()
        s1.store.close()


async def test_min_insync_replicas_refuses_at_once_below_it(tmp_path: Path, etcd: Etcd) -> None:
    g = await _group(tmp_path, etcd, 2)
    m = g.master
    assert m.server is not None
    rng = random.Random(8)
    s1 = open_slave(tmp_path / "s1", 1)
    try:
        end = m.put(2, rng)
        with pytest.raises(SlaveNotAvailableError, match="min_insync_replicas 2"):
            await m.server.wait_replicated(end, 10_000)   # at once, not after the timeout
        await s1.follower.follow(m.addr, m.epoch, 0)
        await until(lambda: g.isr.members == [0, 1])
        await m.server.wait_replicated(m.put(2, rng), 10_000)
        await s1.follower.stop()
        await until(lambda: g.isr.members == [0])
        assert await g.stored() == [0]
        with pytest.raises(SlaveNotAvailableError, match="min_insync_replicas 2"):
            await m.server.wait_replicated(m.put(2, rng), 10_000)
    finally:
        await s1.follower.stop()
        s1.store.close()
        await _close(g)


async def test_a_deposed_master_cannot_shrink_the_set_and_acks_nothing_a_member_lacks(
        group: Group, tmp_path: Path) -> None:
    m, isr = group.master, group.isr
    assert m.server is not None
    rng = random.Random(9)
    s1 = open_slave(tmp_path / "s1", 1)
    await s1.follower.follow(m.addr, m.epoch, 0)
    try:
        m.put(3, rng)
        await until(lambda: isr.members == [0, 1])
        # The master's lease is revoked behind its back: its key is gone, it is deposed.
        lease = group.election.lease_id
        assert lease is not None
        await group.registry.client.revoke_lease(lease)
        await s1.follower.stop()
        await until(lambda: m.server is not None and m.server.slaves() == [])
        # The smaller set cannot be written: a write slave 1 lacks is never acknowledged.
        end = m.put(3, rng)
        with pytest.raises(SlaveNotAvailableError):
            await m.server.wait_replicated(end, 500)
        assert s1.store.commit_log_max_offset < end
        assert await group.stored() == [0, 1]   # etcd still lists slave 1 as electable
    finally:
        await s1.follower.stop()
        s1.store.close()


async def test_a_slave_joins_the_set_under_a_steady_load(group: Group, tmp_path: Path) -> None:
    m, isr = group.master, group.isr
    assert m.server is not None
    server = m.server
    rng = random.Random(10)
    m.put(200, rng)   # a backlog to stream first
    stop = asyncio.Event()
    acked: list[int] = []

    async def load() -> None:
        while not stop.is_set():
            end = m.put(2, rng, max_body=500)
            await server.wait_replicated(end, 5_000)
            acked.append(end)
            await asyncio.sleep(0.001)

    task = asyncio.create_task(load())
    s1 = open_slave(tmp_path / "s1", 1)
    try:
        await s1.follower.follow(m.addr, m.epoch, 0)
        await until(lambda: isr.members == [0, 1])
        joined_at = len(acked)
        await until(lambda: len(acked) >= joined_at + 20)
        # Writes acknowledged while slave 1 is in the set are on it.
        assert s1.store.commit_log_max_offset >= acked[-1]
        # Read while slave 1 is still linked: once it stops, the set shrinks again.
        assert await group.stored() == [0, 1]
    finally:
        stop.set()
        await task
        await s1.follower.stop()
        s1.store.close()


class _SlowEtcdElection:
    """A unit-test stand-in for the election: `put_if_leader` lands after a delay."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s, self.listed, self.fail_after_landing = delay_s, [], False

    async def put_if_leader(self, key: bytes, value: bytes) -> bool:
        await asyncio.sleep(self.delay_s)
        self.listed = json.loads(value)["members"]
        if self.fail_after_landing:
            raise ConnectionError("reply lost after the write landed")
        return True


class _RecordingServer:
    class store:  # noqa: N801 - the attribute the set reads
        commit_log_max_offset = 1000

    def __init__(self) -> None:
        self.required: frozenset[int] = frozenset()

    def set_required(self, ids: set[int], min_slaves: int) -> None:
        self.required = frozenset(ids)

    async def wait_replicated(self, end: int, timeout_ms: int, enforce_min: bool = True) -> None:
        return None


@pytest.mark.parametrize("reply_lost", [False, True])
async def test_a_member_etcd_may_list_is_waited_for_while_the_write_is_in_flight(
        reply_lost: bool) -> None:
    # Slave 2 joins; while the write of [1, 2] is in flight its link ends. Until etcd is
    # known to hold a set without 2, writes must still wait for 2: etcd may list it, and
    # a listed member may be elected (acknowledging without it would lose those writes).
    election = _SlowEtcdElection(0.3)
    server = _RecordingServer()
    insync = InSyncSet(election, b"k", 1, 1, 3000)  # type: ignore[arg-type]
    assert await insync.begin(5, server)  # type: ignore[arg-type]
    try:
        election.fail_after_landing = reply_lost
        insync.caught_up(2)
        await asyncio.sleep(0.1)                 # the join is done; [1, 2] is being written
        insync.unlinked(2)
        assert 2 in server.required              # etcd may list 2 any moment now
        await asyncio.sleep(0.35)                # the write of [1, 2] landed
        assert election.listed == [1, 2] and 2 in server.required
        election.fail_after_landing = False
        for _ in range(50):                      # the writer then writes the smaller set
            if election.listed == [1] and insync.members == [1]:
                break
            await asyncio.sleep(0.1)
        assert election.listed == [1] and server.required == frozenset()
    finally:
        await insync.end()
