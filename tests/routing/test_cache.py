"""RegistryCache against a real etcd: initial load, watch updates, lease expiry, reload."""
from __future__ import annotations

import asyncio
from pathlib import Path

from ferry.routing import BrokerInfo, CacheChange, EtcdRegistry, RegistryCache, TopicConfig
from ferry.routing.models import GroupConfig

from tests.support.procs import Etcd, start_etcd

from .conftest import eventually
from .etcd_restart import restart_etcd

MASTER_A = BrokerInfo("c1", "broker-a", 0, "127.0.0.1:10911", topics={"orders": 8})
SLAVE_A = BrokerInfo("c1", "broker-a", 1, "127.0.0.1:10913", topics={"orders": 8})
MASTER_B = BrokerInfo("c1", "broker-b", 0, "127.0.0.1:10921", topics={"local": 2})


async def registered(etcd: Etcd, prefix: str, info: BrokerInfo, ttl_s: int = 10
                     ) -> EtcdRegistry:
    reg = EtcdRegistry(etcd.endpoint, prefix=prefix)
    await reg.start()
    await reg.register_broker(info, ttl_s=ttl_s, keepalive_s=ttl_s / 4)
    return reg


async def test_initial_load_sees_existing_keys(registry: EtcdRegistry) -> None:
    await registry.put_topic(TopicConfig("orders", queues=4))
    await registry.put_group(GroupConfig("g1"))
    await registry.register_broker(MASTER_A, ttl_s=10, keepalive_s=2)
    cache = RegistryCache(registry)
    await cache.start()
    try:
        assert cache.loaded
        assert cache.topics == {"orders": TopicConfig("orders", queues=4)}
        assert list(cache.groups) == ["g1"]
        assert cache.brokers == {MASTER_A.key: MASTER_A}
    finally:
        await cache.stop()


async def test_watch_follows_changes_and_notifies(registry: EtcdRegistry,
                                                  cache: RegistryCache) -> None:
    seen: list[CacheChange] = []
    cache.add_listener(seen.append)
    rev = await registry.put_topic(TopicConfig("orders", queues=4))
    assert await cache.wait_revision(rev, timeout_s=5)
    assert cache.topics["orders"].queues == 4
    rev = await registry.put_topic(TopicConfig("orders", queues=6))
    assert await cache.wait_revision(rev, timeout_s=5)
    assert cache.topics["orders"].queues == 6
    rev = await registry.delete_topic("orders")
    assert await cache.wait_revision(rev, timeout_s=5)
    assert "orders" not in cache.topics
    assert [(c.kind, c.key, c.value is None) for c in seen] == [
        ("topic", "orders", False), ("topic", "orders", False), ("topic", "orders", True)]


async def test_route_groups_master_and_slaves(etcd: Etcd, prefix: str,
                                              registry: EtcdRegistry, cache: RegistryCache) -> None:
    regs = [await registered(etcd, prefix, b) for b in (MASTER_A, SLAVE_A, MASTER_B)]
    try:
        await eventually(lambda: len(cache.brokers) == 3)
        assert cache.route("orders") is not None  # advertised by broker-a, no config yet
        assert [b["name"] for b in cache.route("orders")["brokers"]] == ["broker-a"]  # type: ignore[index]
        assert cache.route("nowhere") is None
        rev = await registry.put_topic(TopicConfig("orders", queues=3, perm="r"))
        await cache.wait_revision(rev)
        route = cache.route("orders")
        assert route == {"topic": "orders", "type": "normal", "perm": "r", "brokers": [
            {"name": "broker-a", "cluster": "c1", "master": MASTER_A.addr,
             "slaves": [SLAVE_A.addr], "queues": 3, "perm": "r", "epoch": 0},
            {"name": "broker-b", "cluster": "c1", "master": MASTER_B.addr,
             "slaves": [], "queues": 3, "perm": "r", "epoch": 0}], "priority_levels": 1}
        rev = await registry.put_topic(TopicConfig("orders", brokers=("broker-b",)))
        await cache.wait_revision(rev)
        assert [b["name"] for b in cache.route("orders")["brokers"]] == ["broker-b"]  # type: ignore[index]
    finally:
        for reg in regs:
            await reg.unregister_broker()
            await reg.stop()


async def test_elected_master_with_the_highest_epoch_wins(etcd: Etcd, prefix: str,
                                                         registry: EtcdRegistry,
                                                         cache: RegistryCache) -> None:
    # A dead master's key outlives it until its lease ends; the new term's master wins.
    stale = BrokerInfo("c1", "broker-a", 0, "127.0.0.1:20001", topics={"t": 2},
                       role="master", epoch=3)
    new = BrokerInfo("c1", "broker-a", 1, "127.0.0.1:20002", topics={"t": 2},
                     role="master", epoch=4)
    slave = BrokerInfo("c1", "broker-a", 2, "127.0.0.1:20003", topics={"t": 2},
                       role="slave", epoch=4)
    regs = [await registered(etcd, prefix, b) for b in (stale, new, slave)]
    try:
        await eventually(lambda: len(cache.brokers) == 3)
        (entry,) = cache.route("t")["brokers"]  # type: ignore[index]
        assert entry["master"] == new.addr and entry["epoch"] == 4
        assert entry["slaves"] == [slave.addr]
    finally:
        for reg in regs:
            await reg.unregister_broker()
            await reg.stop()


async def test_listed_broker_stays_in_route_while_down(etcd: Etcd, prefix: str,
                                                       registry: EtcdRegistry,
                                                       cache: RegistryCache) -> None:
    """Ordered keys hash over the route: a listed broker that is down keeps its queues there."""
    reg = await registered(etcd, prefix, MASTER_B)
    try:
        rev = await registry.put_topic(TopicConfig("orders", queues=2,
                                                   brokers=("broker-a", "broker-b")))
        await cache.wait_revision(rev)
        await eventually(lambda: MASTER_B.key in cache.brokers)
        route = cache.route("orders")
        assert route is not None
        assert [(b["name"], b["master"], b["queues"]) for b in route["brokers"]] == [
            ("broker-a", None, 2), ("broker-b", MASTER_B.addr, 2)]
        rev = await registry.put_topic(TopicConfig("unlisted", queues=2))
        await cache.wait_revision(rev)
        route = cache.route("unlisted")   # "every master": only the live ones
        assert route is not None and [b["name"] for b in route["brokers"]] == ["broker-b"]
    finally:
        await reg.unregister_broker()
        await reg.stop()


async def test_expired_lease_removes_broker_from_cache(etcd: Etcd, prefix: str,
                                                       cache: RegistryCache) -> None:
    reg = await registered(etcd, prefix, MASTER_A, ttl_s=2)
    await eventually(lambda: MASTER_A.key in cache.brokers)
    await reg.stop()  # keep-alive stops, no unregister: the lease must expire
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    await eventually(lambda: MASTER_A.key not in cache.brokers, timeout_s=8)
    assert loop.time() - t0 < 6
    await eventually(lambda: cache.route("orders") is None)


async def test_cache_reloads_after_etcd_restart(tmp_path: Path) -> None:
    own = start_etcd(tmp_path / "etcd")
    reg = EtcdRegistry(own.endpoint, prefix="/ferry/")
    writer = EtcdRegistry(own.endpoint, prefix="/ferry/")
    await reg.start()
    await writer.start()
    cache = RegistryCache(reg)
    await cache.start()
    try:
        rev = await writer.put_topic(TopicConfig("before"))
        assert await cache.wait_revision(rev)
        own.proc.stop()
        await eventually(lambda: not cache.watching, timeout_s=10)
        await restart_etcd(own, tmp_path / "etcd")
        await eventually(lambda: cache.watching, timeout_s=15)
        await writer.put_topic(TopicConfig("after"))
        await eventually(lambda: "after" in cache.topics, timeout_s=10)
        assert "before" in cache.topics and cache.reloads >= 1
    finally:
        await cache.stop()
        await reg.stop()
        await writer.stop()
        own.proc.stop()
