"""The session fixtures start real servers that answer real requests."""
from __future__ import annotations

import aetcd
import redis

from tests.support.procs import Etcd, Redis


async def test_etcd_fixture_stores_and_leases(etcd: Etcd) -> None:
    async with aetcd.Client(host=etcd.host, port=etcd.port) as client:
        lease = await client.lease(5)
        await client.put(b"/fixture-test/key", b"value", lease=lease)
        got = await client.get(b"/fixture-test/key")
        assert got is not None and got.value == b"value"
        await lease.revoke()
        assert await client.get(b"/fixture-test/key") is None


def test_redis_fixture_answers(redis_server: Redis) -> None:
    client = redis.Redis(host=redis_server.host, port=redis_server.port)
    try:
        client.set("fixture-test", "1")
        assert client.get("fixture-test") == b"1"
        assert client.xadd("fixture-stream", {"f": "v"})
    finally:
        client.close()


def test_servers_are_separate_processes(etcd: Etcd, redis_server: Redis) -> None:
    assert etcd.proc.alive() and redis_server.proc.alive()
    assert etcd.port != redis_server.port
