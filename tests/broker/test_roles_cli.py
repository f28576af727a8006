"""`ferry broker list` against a real namesrv and a real broker group."""
from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.broker import roles_support
from tests.broker.roles_support import eventually, replication, two_members
from tests.broker.wire_client import message
from tests.support.procs import Etcd, Proc, free_port, spawn, wait_until_ready

pytestmark = pytest.mark.integration
group, prefix = roles_support.group, roles_support.prefix  # fixtures


@pytest.fixture
def namesrv(tmp_path: Path, etcd: Etcd, prefix: str) -> Iterator[str]:
    port = free_port()
    env = {"FERRY_NAMESRV_HOST": "127.0.0.1", "FERRY_NAMESRV_PORT": str(port),
           "FERRY_NAMESRV_ETCD": etcd.endpoint, "FERRY_NAMESRV_ETCD_PREFIX": prefix}
    proc: Proc = spawn("namesrv", [sys.executable, "-m", "ferry_namesrv"], tmp_path / "ns", env)
    wait_until_ready(proc, f"http://127.0.0.1:{port}/readyz", 20)
    yield f"127.0.0.1:{port}"
    proc.stop()


def ferry(namesrv: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ferry.cli.main", "--namesrv", namesrv, *args],
                          capture_output=True, text=True, timeout=60, check=False)


def rows(namesrv: str) -> list[dict[str, Any]]:
    res = ferry(namesrv, "broker", "list", "--json")
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


async def test_broker_list_shows_roles_epochs_and_lag(group: Any, namesrv: str) -> None:
    master, slave = await two_members(group)
    epoch = replication(master)["epoch"]
    mc = await master.client()
    try:
        await mc.send("listed", 0, [message(b"m" * 100) for _ in range(10)])
    finally:
        await mc.close()
    await eventually(lambda: replication(slave)["end_offset"]
                     == replication(master)["end_offset"])
    master_id, slave_id = int(master.env["FERRY_BROKER_ID"]), int(slave.env["FERRY_BROKER_ID"])

    def settled() -> bool:
        got = {r["id"]: r for r in rows(namesrv)}
        return (set(got) == {master_id, slave_id} and got[master_id]["role"] == "master"
                and got[slave_id]["role"] == "slave" and got[slave_id]["lag_bytes"] == 0)

    await eventually(settled)
    got = {r["id"]: r for r in await asyncio.to_thread(rows, namesrv)}
    m, s = got[master_id], got[slave_id]
    assert m["group"] == s["group"] == "DefaultCluster/broker-a"
    assert m["epoch"] == s["epoch"] == epoch
    assert m["end_offset"] == s["end_offset"] > 0
    assert m["state"] == "writable, 1 slave(s)" and s["state"].startswith("following ")
    # The table for people: a header and one line per member.
    res = ferry(namesrv, "broker", "list")
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[0].split() == ["group", "id", "role", "epoch", "addr", "end_offset",
                                "lag_bytes", "in_sync", "state"]
    assert m["in_sync"] == s["in_sync"] == "-"   # async: no in-sync set
    assert len(lines) == 3 and "master" in lines[1] and "slave" in lines[2]
    # A member that is gone from namesrv is gone from the list.
    slave.proc.stop()
    await eventually(lambda: [r["id"] for r in rows(namesrv)] == [master_id])


async def test_broker_list_shows_the_in_sync_set_of_a_sync_group(group: Any, namesrv: str) -> None:
    master, slave = await two_members(group, mode="sync")
    master_id, slave_id = int(master.env["FERRY_BROKER_ID"]), int(slave.env["FERRY_BROKER_ID"])

    def in_sync() -> dict[int, str]:
        return {r["id"]: r["in_sync"] for r in rows(namesrv)}

    await eventually(lambda: in_sync() == {master_id: "yes", slave_id: "yes"})
    slave.proc.kill9()
    await eventually(lambda: in_sync().get(master_id) == "yes"
                     and in_sync().get(slave_id, "no") == "no")
