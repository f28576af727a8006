"""EtcdRegistry against a real etcd: leases, keep-alive, re-registration, config CRUD."""
from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import aetcd
import pytest
from ferry.errors import AlreadyExistsError, InvalidNameError
from ferry.routing import BrokerInfo, EtcdRegistry, GroupConfig, TopicConfig, parse_endpoints

from tests.support.procs import Etcd, start_etcd

from .conftest import eventually
from .etcd_restart import restart_etcd

BROKER = BrokerInfo("c1", "broker-a", 0, "127.0.0.1:10911", topics={"orders": 8})


def test_parse_endpoints() -> None:
    assert parse_endpoints("a:1, http://b:2,") == [("a", 1), ("b", 2)]
    for bad in ("", "a", "a:x", "a:0", ":5"):
        with pytest.raises(ValueError):
            parse_endpoints(bad)


async def test_register_keeps_lease_alive_past_ttl(registry: EtcdRegistry) -> None:
    await registry.register_broker(BROKER, ttl_s=2, keepalive_s=0.5)
    await asyncio.sleep(3.5)  # well past the TTL: only the keep-alive holds the key
    assert [b.key for b in await registry.list_brokers()] == [BROKER.key]
    assert registry.reregistrations == 0


async def test_update_and_unregister(registry: EtcdRegistry) -> None:
    await registry.register_broker(BROKER, ttl_s=5, keepalive_s=1)
    updated = BrokerInfo(**{**BROKER.__dict__, "topics": {"orders": 8, "audit": 2}})
    await registry.update_broker(updated)
    assert await registry.list_brokers() == [updated]
    await registry.unregister_broker()
    assert await registry.list_brokers() == []


async def test_stopped_registry_lets_the_lease_expire(etcd: Etcd, prefix: str,
                                                      registry: EtcdRegistry) -> None:
    dying = EtcdRegistry(etcd.endpoint, prefix=prefix)
    await dying.start()
    await dying.register_broker(BROKER, ttl_s=2, keepalive_s=0.5)
    await dying.stop()  # no unregister: like a process that died
    assert len(await registry.list_brokers()) == 1
    await asyncio.sleep(3.5)
    assert await registry.list_brokers() == []


async def test_registers_again_after_lease_loss(etcd: Etcd, registry: EtcdRegistry) -> None:
    await registry.register_broker(BROKER, ttl_s=3, keepalive_s=0.3)
    first = registry.lease_id
    assert first is not None
    # Someone (etcd losing state, an operator) revokes the lease: the key goes.
    async with aetcd.Client(host=etcd.host, port=etcd.port) as other:
        await other.revoke_lease(first)
    await eventually(lambda: registry.reregistrations == 1, timeout_s=5)
    assert registry.lease_id != first
    assert [b.key for b in await registry.list_brokers()] == [BROKER.key]


async def test_register_rejects_bad_timing(registry: EtcdRegistry) -> None:
    with pytest.raises(ValueError):
        await registry.register_broker(BROKER, ttl_s=2, keepalive_s=2)


async def test_topic_crud_and_create_only(registry: EtcdRegistry) -> None:
    assert await registry.get_topic("orders") is None
    rev = await registry.put_topic(TopicConfig("orders", queues=4), create_only=True)
    assert rev > 0
    with pytest.raises(AlreadyExistsError):
        await registry.put_topic(TopicConfig("orders", queues=16), create_only=True)
    assert (await registry.get_topic("orders")) == TopicConfig("orders", queues=4)
    await registry.put_topic(TopicConfig("orders", queues=16))
    assert (await registry.get_topic("orders")) == TopicConfig("orders", queues=16)
    await registry.put_topic(TopicConfig("audit"))
    assert sorted(t.name for t in await registry.list_topics()) == ["audit", "orders"]
    assert await registry.delete_topic("orders") > 0
    assert await registry.delete_topic("orders") == 0
    assert await registry.get_topic("orders") is None
    with pytest.raises(InvalidNameError):
        await registry.get_topic("bad name")


async def test_concurrent_create_only_has_one_winner(registry: EtcdRegistry) -> None:
    async def create(queues: int) -> int:
        try:
            await registry.put_topic(TopicConfig("race", queues=queues), create_only=True)
            return queues
        except AlreadyExistsError:
            return 0
    winners = [q for q in await asyncio.gather(*(create(q) for q in range(1, 11))) if q]
    assert len(winners) == 1
    assert (await registry.get_topic("race")) == TopicConfig("race", queues=winners[0])


async def test_group_crud(registry: EtcdRegistry) -> None:
    await registry.put_group(GroupConfig("g1", retry_max=3), create_only=True)
    with pytest.raises(AlreadyExistsError):
        await registry.put_group(GroupConfig("g1"), create_only=True)
    assert await registry.get_group("g1") == GroupConfig("g1", retry_max=3)
    assert [g.name for g in await registry.list_groups()] == ["g1"]
    assert await registry.delete_group("g1") > 0
    assert await registry.list_groups() == []


async def test_invalid_values_in_etcd_are_skipped(etcd: Etcd, registry: EtcdRegistry,
                                                  prefix: str) -> None:
    async with aetcd.Client(host=etcd.host, port=etcd.port) as other:
        await other.put(f"{prefix}topics/broken".encode(), b"{not json")
    await registry.put_topic(TopicConfig("fine"))
    assert [t.name for t in await registry.list_topics()] == ["fine"]


async def test_registers_again_after_a_long_pause(registry: EtcdRegistry) -> None:
    await registry.register_broker(BROKER, ttl_s=1, keepalive_s=0.3)
    first = registry.lease_id
    time.sleep(3)  # the whole event loop stalls (GC pause, swapped out) past the TTL
    await eventually(lambda: registry.reregistrations >= 1, timeout_s=5)
    assert registry.lease_id != first
    async def listed() -> bool:
        return await _keys(registry) == [BROKER.key]
    await eventually_async(listed)


async def test_update_after_lease_loss_registers_again(etcd: Etcd,
                                                       registry: EtcdRegistry) -> None:
    await registry.register_broker(BROKER, ttl_s=30, keepalive_s=10)
    async with aetcd.Client(host=etcd.host, port=etcd.port) as other:
        await other.revoke_lease(registry.lease_id)
    updated = BrokerInfo(**{**BROKER.__dict__, "topics": {"new": 1}})
    await registry.update_broker(updated)  # the keep-alive has not noticed yet
    assert await registry.list_brokers() == [updated]


async def test_lease_survives_an_etcd_restart(tmp_path: Path) -> None:
    own = start_etcd(tmp_path / "etcd")
    reg = EtcdRegistry(own.endpoint, prefix="/ferry/")
    await reg.start()
    try:
        await reg.register_broker(BROKER, ttl_s=3, keepalive_s=0.5)
        own.proc.stop()
        await asyncio.sleep(1)
        await restart_etcd(own, tmp_path / "etcd")
        await asyncio.sleep(4)  # longer than the TTL: only keep-alives can hold the key
        assert await _keys(reg) == [BROKER.key]
    finally:
        await reg.stop()
        own.proc.stop()


async def _keys(reg: EtcdRegistry) -> list[tuple[str, str, int]]:
    return [b.key for b in await reg.list_brokers()]


async def eventually_async(check: Any, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not await check():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)
