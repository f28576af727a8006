"""Parts of broker roles: config, offsets from the master, a term older than the store."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from ferry.errors import NotMasterError, StoreError
from ferry.store.epochs import EpochLog
from ferry_broker.config import BrokerConfig
from ferry_broker.consumer_offsets import ConsumerOffsetManager

from tests.broker import roles_support
from tests.broker.conftest import start_broker
from tests.broker.roles_support import eventually, replication
from tests.broker.wire_client import message
from tests.support.procs import Etcd

group, prefix = roles_support.group, roles_support.prefix  # fixtures


def whole_table(mgr: ConsumerOffsetManager) -> bytes:
    """The table as the first OFFSETS frame of a new link carries it (one batch here)."""
    (payload,) = mgr.encode_changes(mgr.changes_since(-1)[1], 1 << 20)
    return payload


def test_replication_settings_are_checked() -> None:
    assert BrokerConfig().replication == "none" and BrokerConfig().repl_addr == ""
    cfg = BrokerConfig(replication="sync", repl_port=12000, advertise_host="10.0.0.5")
    assert cfg.repl_addr == "10.0.0.5:12000"
    with pytest.raises(ValueError, match="replication must be one of"):
        BrokerConfig(replication="semi")
    with pytest.raises(ValueError, match="needs etcd"):
        BrokerConfig(replication="async", etcd="")
    with pytest.raises(ValueError, match="election_ttl_s"):
        BrokerConfig(replication="async", election_ttl_s=1)
    env = {"FERRY_BROKER_REPLICATION": "async", "FERRY_BROKER_REPL_TIMEOUT_MS": "700"}
    assert BrokerConfig.from_env(env).repl_timeout_ms == 700


def test_master_offsets_are_clamped_to_the_slaves_log_and_local_ones_stay(tmp_path: Path) -> None:
    master = ConsumerOffsetManager(tmp_path / "m.json")
    master.commit("g", "t", 0, 100)
    master.commit("g", "t", 1, 5)
    slave = ConsumerOffsetManager(tmp_path / "s.json")
    slave.commit("g2", "t", 0, 3)  # committed at the slave while the master was away
    ends = {("t", 0): 90, ("t", 1): 50}
    changed = slave.merge_snapshot(whole_table(master), lambda t, q: ends[(t, q)])
    assert changed == 2 and slave.dirty
    # Offset 100 lies past the slave's log (end 90): taking it would skip 90..99
    # once the slave leads and writes there.
    assert slave.query("g", "t", 0) == 90
    assert slave.query("g", "t", 1) == 5
    assert slave.query("g2", "t", 0) == 3
    assert slave.merge_snapshot(whole_table(master), lambda t, q: ends[(t, q)]) == 0
    with pytest.raises(StoreError):
        slave.merge_snapshot(b"not json", lambda t, q: 0)


def test_offsets_past_a_truncated_log_are_lowered_to_its_queue_ends(tmp_path: Path) -> None:
    # A member that rejoined (its log truncated) and leads again before the new master's
    # offsets reached it must not keep offsets past its own queue ends.
    offsets = ConsumerOffsetManager(tmp_path / "o.json")
    offsets.commit("g", "t", 0, 120)
    offsets.commit("g", "t", 1, 30)
    ends = {("t", 0): 100, ("t", 1): 100}
    assert offsets.clamp(lambda t, q: ends[(t, q)]) == 1
    assert offsets.query("g", "t", 0) == 100 and offsets.query("g", "t", 1) == 30
    assert offsets.dirty and offsets.clamp(lambda t, q: ends[(t, q)]) == 0


async def test_a_term_older_than_the_store_takes_no_writes(group: Any, tmp_path: Path) -> None:
    """etcd lost the epoch key (fresh prefix): epoch 1 < the store's 7 is refused."""
    data = tmp_path / "old-store"
    data.mkdir()
    EpochLog(str(data)).append(7, 0)
    member = group(0, data_dir=data)
    await eventually(lambda: "not taking writes" in member.proc.log())
    r = replication(member)
    assert r["role"] == "slave" and not r["writable"]
    client = await member.client()
    try:
        with pytest.raises(NotMasterError):
            await client.send("t", 0, [message(b"x")])
    finally:
        await client.close()


async def test_a_broker_without_replication_is_a_static_master(tmp_path: Path, etcd: Etcd) -> None:
    b = start_broker(tmp_path, etcd)
    try:
        r = replication(b)
        assert (r["mode"], r["role"], r["epoch"], r["writable"]) == ("none", "", 0, True)
        assert "slaves" not in r and "follower" not in r
        client = await b.client()
        try:
            await client.send("plain", 0, [message(b"as before issue 9")])
        finally:
            await client.close()
    finally:
        b.proc.stop()
