"""Roles of a broker group on real processes: election, fencing, slave reads, failover, rejoin."""
from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from ferry.errors import NotMasterError
from ferry.routing import EtcdRegistry
from ferry.wire import RequestCode

from tests.broker import roles_support
from tests.broker.roles_support import eventually, follows, is_master, replication, two_members
from tests.broker.wire_client import message
from tests.support.procs import Etcd

pytestmark = pytest.mark.integration
group, prefix = roles_support.group, roles_support.prefix  # fixtures

async def test_one_master_one_slave_and_the_slave_refuses_writes(
        group: Any, etcd: Etcd, prefix: str) -> None:
    master, slave = await two_members(group)
    rm, rs = replication(master), replication(slave)
    assert rm["mode"] == "async" and rm["epoch"] >= 1 and rs["epoch"] == rm["epoch"]
    await eventually(lambda: [s["broker_id"] for s in replication(master)["slaves"]]
                     == [int(slave.env["FERRY_BROKER_ID"])])
    # Registered roles: the route picks the master by role and epoch.
    async with EtcdRegistry(etcd.endpoint, prefix=prefix) as reg:
        async def roles() -> dict[str, tuple[str, int]]:
            return {b.addr: (b.role, b.epoch) for b in await reg.list_brokers()}
        deadline = time.monotonic() + 10
        while (got := await roles()) != {f"127.0.0.1:{master.port}": ("master", rm["epoch"]),
                                         f"127.0.0.1:{slave.port}": ("slave", rm["epoch"])}:
            assert time.monotonic() < deadline, got
            await asyncio.sleep(0.1)
        assert all(b.repl_addr for b in await reg.list_brokers())
    client = await slave.client()
    try:
        with pytest.raises(NotMasterError, match="not the master"):
            await client.send("orders", 0, [message(b"to the slave")])
    finally:
        await client.close()


async def test_messages_sent_to_the_master_are_read_from_the_slave(group: Any) -> None:
    master, slave = await two_members(group)
    mc, sc = await master.client(), await slave.client()
    try:
        # A long poll parked on the slave wakes when the records arrive there.
        parked = asyncio.create_task(sc.pull("orders", 1, 0, max_wait_ms=15_000))
        await asyncio.sleep(0.3)
        sent = [message(f"m{i}".encode(), keys=f"k{i}") for i in range(50)]
        ack = await mc.send("orders", 1, sent)
        assert ack["count"] == 50
        fields, first = await parked
        assert fields["status"] == "FOUND" and first
        got: list[bytes] = []
        while len(got) < 50:
            fields, msgs = await sc.pull("orders", 1, len(got), max_count=100,
                                         max_wait_ms=5000)
            got += [m.body for m in msgs]
        assert got == [m.body for m in sent]
        # Offsets committed at the master reach the slave over the replication link.
        await mc.call(RequestCode.COMMIT_OFFSET, {"group": "g1", "topic": "orders",
                                                  "queue_id": 1, "offset": 20})
        await eventually(lambda: slave.get_json("/v1/stats")["groups"].get("g1", {})
                         .get("orders", {}).get("1", {}).get("committed_offset") == 20)
    finally:
        await mc.close()
        await sc.close()


async def test_failover_on_sigterm_and_the_old_master_rejoins_as_slave(
        group: Any, tmp_path: Path, etcd: Etcd, prefix: str) -> None:
    master, slave = await two_members(group)
    epoch = replication(master)["epoch"]
    mc = await master.client()
    await mc.send("orders", 0, [message(f"before-{i}".encode()) for i in range(10)])
    await mc.close()
    await eventually(lambda: replication(slave)["end_offset"]
                     == replication(master)["end_offset"])
    old_id = int(master.env["FERRY_BROKER_ID"])
    master.proc.stop()  # SIGTERM: it resigns, the slave takes over without a lease wait
    await eventually(lambda: is_master(slave), timeout_s=15)
    assert replication(slave)["epoch"] > epoch
    sc = await slave.client()
    try:
        ack = await sc.send("orders", 0, [message(b"after")])
        assert ack["queue_offset"] == 10
        # The old master comes back on its old store: a slave of the new term.
        back = group(old_id, data_dir=master.data_dir)
        await eventually(lambda: follows(back, slave))
        await sc.send("orders", 0, [message(b"after-rejoin")])
        await eventually(lambda: replication(back)["end_offset"]
                         == replication(slave)["end_offset"])
        bc = await back.client()
        try:
            msgs = await bc.pull_all("orders", 0, 0, max_count=100)
            assert [m.body for m in msgs] == ([f"before-{i}".encode() for i in range(10)]
                                              + [b"after", b"after-rejoin"])
            with pytest.raises(NotMasterError):
                await bc.send("orders", 0, [message(b"to the old master")])
        finally:
            await bc.close()
    finally:
        await sc.close()


async def test_failover_after_kill9_waits_for_the_lease_only(group: Any) -> None:
    master, slave = await two_members(group)
    epoch = replication(master)["epoch"]
    mc = await master.client()
    await mc.send("orders", 2, [message(b"acked before the crash")])
    await mc.close()
    await eventually(lambda: replication(slave)["end_offset"]
                     == replication(master)["end_offset"])
    master.proc.kill9()  # no resignation: the election lease has to expire
    await eventually(lambda: is_master(slave), timeout_s=15)
    assert replication(slave)["epoch"] == epoch + 1
    sc = await slave.client()
    try:
        _, msgs = await sc.pull("orders", 2, 0)
        assert [m.body for m in msgs] == [b"acked before the crash"]
        ack = await sc.send("orders", 2, [message(b"after the crash")])
        assert ack["queue_offset"] == 1
    finally:
        await sc.close()


async def test_a_paused_master_acks_nothing_once_its_lease_may_have_ended(group: Any) -> None:
    """SIGSTOP past the lease, a new master elected, SIGCONT: the old one refuses, then follows."""
    master, slave = await two_members(group)
    epoch = replication(master)["epoch"]
    mc = await master.client()
    try:
        await mc.send("fence", 0, [message(b"before the pause")])
        await eventually(lambda: replication(slave)["end_offset"]
                         == replication(master)["end_offset"])  # async: let it arrive
        master.proc.popen.send_signal(signal.SIGSTOP)
        try:
            await eventually(lambda: is_master(slave), timeout_s=15)
            assert replication(slave)["epoch"] == epoch + 1
            # These wait in the paused master's socket buffer until it runs again.
            stale = [asyncio.create_task(mc.send("fence", 0, [message(f"stale-{i}".encode())]))
                     for i in range(5)]
            await asyncio.sleep(0.3)
        finally:
            master.proc.popen.send_signal(signal.SIGCONT)
        results = await asyncio.gather(*stale, return_exceptions=True)
        assert all(isinstance(r, NotMasterError) for r in results), results
    finally:
        await mc.close()
    await eventually(lambda: follows(master, slave))
    sc = await slave.client()
    try:
        _, msgs = await sc.pull("fence", 0, 0)
        assert [m.body for m in msgs] == [b"before the pause"]
    finally:
        await sc.close()
