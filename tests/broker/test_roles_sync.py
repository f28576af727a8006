"""Sync replication, slave-read suggestions and the most-caught-up preference, on real processes."""
from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import aetcd
import pytest
from ferry.errors import SlaveNotAvailableError

from tests.broker import roles_support
from tests.broker.roles_support import eventually, follows, is_master, replication, two_members
from tests.broker.wire_client import message
from tests.support.procs import Etcd

pytestmark = pytest.mark.integration
group, prefix = roles_support.group, roles_support.prefix  # fixtures


def insync(b: Any) -> list[int]:
    return list(replication(b).get("insync", {}).get("members", []))


async def test_sync_master_acks_only_what_a_slave_has(group: Any) -> None:
    """min_insync_replicas=2: strict, an ack means a slave has the records."""
    strict = {"mode": "sync", "FERRY_BROKER_MIN_INSYNC_REPLICAS": "2"}
    alone = group(0, FERRY_BROKER_REPL_TIMEOUT_MS="500", **strict)
    await eventually(lambda: is_master(alone))
    assert insync(alone) == [0]
    client = await alone.client()
    try:
        # No slave: the records are stored, but never acknowledged (retriable error).
        with pytest.raises(SlaveNotAvailableError):
            await client.send("pay", 0, [message(b"no slave yet")])
    finally:
        await client.close()
    slave = group(1, FERRY_BROKER_REPL_TIMEOUT_MS="5000", **strict)
    await eventually(lambda: follows(slave, alone))
    await eventually(lambda: insync(alone) == [0, 1])
    mc, sc = await alone.client(), await slave.client()
    try:
        for i in range(20):
            ack = await mc.send("pay", 0, [message(f"p{i}".encode())])
            # Acknowledged means a slave has it: readable there at once, no wait.
            _, msgs = await sc.pull("pay", 0, ack["queue_offset"], max_count=1)
            assert [m.body for m in msgs] == [f"p{i}".encode()]
        assert replication(alone)["mode"] == "sync"
    finally:
        await mc.close()
        await sc.close()


async def test_a_lone_sync_master_takes_writes_and_a_caught_up_slave_joins_the_set(
        group: Any) -> None:
    """min_insync_replicas=1 (default): the set is the master alone until a slave catches up."""
    alone = group(0, mode="sync")
    await eventually(lambda: is_master(alone))
    client = await alone.client()
    try:
        await client.send("solo", 0, [message(b"acked by the master alone")])
    finally:
        await client.close()
    slave = group(1, mode="sync")
    await eventually(lambda: follows(slave, alone))
    await eventually(lambda: insync(alone) == [0, 1])
    section = replication(alone)
    assert section["insync"]["epoch"] == section["epoch"]
    assert [s["in_sync"] for s in section["slaves"]] == [True]
    mc, sc = await alone.client(), await slave.client()
    try:
        ack = await mc.send("solo", 0, [message(b"in the set")])
        _, msgs = await sc.pull("solo", 0, ack["queue_offset"], max_count=1)
        assert [m.body for m in msgs] == [b"in the set"]
    finally:
        await mc.close()
        await sc.close()
    # The slave stops: the set shrinks (etcd first) and writes go on.
    slave.proc.stop()
    await eventually(lambda: insync(alone) == [0])
    mc = await alone.client()
    try:
        await mc.send("solo", 0, [message(b"alone again")])
    finally:
        await mc.close()


async def test_far_behind_pulls_are_told_to_read_from_the_slave(group: Any) -> None:
    master, slave = await two_members(group, FERRY_BROKER_SLAVE_READ_LAG_BYTES="4096")
    mc = await master.client()
    try:
        batch = [message(b"x" * 512) for _ in range(40)]  # about 20 KiB of records
        await mc.send("old", 0, batch)
        await eventually(lambda: not any(s["lagging"] for s in replication(master)["slaves"])
                         and replication(master)["slaves"] != [])
        far, _ = await mc.pull("old", 0, 0, max_count=1)
        assert far.get("suggest_slave") is True
        near, _ = await mc.pull("old", 0, 39, max_count=1)
        assert "suggest_slave" not in near
    finally:
        await mc.close()
    # A slave never suggests itself.
    sc = await slave.client()
    try:
        await eventually(lambda: replication(slave)["end_offset"]
                         == replication(master)["end_offset"])
        fields, msgs = await sc.pull("old", 0, 0, max_count=1)
        assert msgs and "suggest_slave" not in fields
    finally:
        await sc.close()


async def test_a_candidate_behind_a_live_sibling_waits_a_bounded_number_of_rounds(
        group: Any, etcd: Etcd, prefix: str) -> None:
    """A sibling that says it is far ahead but never stands delays a takeover, not forever."""
    client = aetcd.Client(host=etcd.host, port=etcd.port)
    await client.connect()
    try:
        lease = await client.lease(30)
        await client.put(f"{prefix}replicas/DefaultCluster/broker-a/9".encode(),
                         json.dumps({"epoch": 99, "end_offset": 1 << 40}).encode(),
                         lease=lease.id)
        started = time.monotonic()
        member = group(0)
        await eventually(lambda: is_master(member), timeout_s=30)
        assert time.monotonic() - started < 30
        log = member.proc.log()
        assert "not standing for master" in log
        assert "standing for master although" in log
        # Its own position (now with its first epoch) is published for its siblings.
        key = f"{prefix}replicas/DefaultCluster/broker-a/0".encode()
        deadline = time.monotonic() + 10
        while True:
            got = await client.get(key)
            if got is not None and json.loads(got.value)["epoch"] == replication(member)["epoch"]:
                break
            assert time.monotonic() < deadline, got
            await asyncio.sleep(0.1)
        await client.revoke_lease(lease.id)
    finally:
        await client.close()


async def test_stats_and_roles_survive_a_slave_restart(group: Any, tmp_path: Path) -> None:
    master, slave = await two_members(group)
    slave.proc.stop()
    await eventually(lambda: replication(master)["slaves"] == [])
    assert is_master(master)  # async: the master goes on alone
    mc = await master.client()
    try:
        await mc.send("solo", 0, [message(b"while the slave is away")])
    finally:
        await mc.close()
    back = group(1, data_dir=slave.data_dir)
    await eventually(lambda: follows(back, master))
    await eventually(lambda: replication(back)["end_offset"]
                     == replication(master)["end_offset"])
