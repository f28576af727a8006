"""Several namesrv instances, restarts and dead brokers: etcd is the only truth."""
from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path
from typing import Any
from uuid import uuid4

import aiohttp
import pytest
from ferry.routing import BrokerInfo, EtcdRegistry

from tests.support.procs import Etcd, spawn

from .conftest import Namesrv, eventually

pytestmark = pytest.mark.integration


async def get(http: aiohttp.ClientSession, url: str) -> tuple[int, Any]:
    async with http.get(url) as resp:
        return resp.status, await resp.json()


@pytest.fixture
def prefix() -> str:
    return f"/t-{uuid4().hex}/"


@pytest.fixture
async def broker(etcd: Etcd, prefix: str) -> Any:
    reg = EtcdRegistry(etcd.endpoint, prefix=prefix)
    await reg.start()
    await reg.register_broker(BrokerInfo("c1", "broker-a", 0, "127.0.0.1:10911"),
                              ttl_s=10, keepalive_s=2)
    yield reg
    await reg.unregister_broker()
    await reg.stop()


async def test_two_instances_answer_the_same_routes(start_namesrv: Any, prefix: str,
                                                    broker: EtcdRegistry,
                                                    http: aiohttp.ClientSession) -> None:
    a: Namesrv = start_namesrv(prefix)
    b: Namesrv = start_namesrv(prefix)
    # Both create at once: one write wins, both answer with it.
    (sa, ra), (sb, rb) = await asyncio.gather(
        get(http, a.url + "/v1/routes/shared?create=1"),
        get(http, b.url + "/v1/routes/shared?create=1"))
    assert sa == sb == 200 and ra == rb
    assert ra["brokers"][0]["master"] == "127.0.0.1:10911"
    async with http.put(a.url + "/v1/topics/shared", json={"queues": 2}) as resp:
        assert resp.status == 200

    async def b_sees_update() -> bool:
        _, route = await get(http, b.url + "/v1/routes/shared")
        return bool(route["brokers"][0]["queues"] == 2)
    await eventually(b_sees_update, timeout_s=5)


async def test_restarted_namesrv_answers_the_same(start_namesrv: Any, prefix: str,
                                                  broker: EtcdRegistry,
                                                  http: aiohttp.ClientSession) -> None:
    ns: Namesrv = start_namesrv(prefix)
    async with http.post(ns.url + "/v1/topics", json={"name": "kept", "queues": 5}) as resp:
        assert resp.status == 201
    before = await get(http, ns.url + "/v1/routes/kept")
    ns.proc.stop()
    assert ns.proc.popen.returncode == 0, ns.proc.log()[-2000:]  # SIGTERM is a clean stop
    assert '"msg": "stopped"' in ns.proc.log()
    again: Namesrv = start_namesrv(prefix, port=ns.port)
    assert await get(http, again.url + "/v1/routes/kept") == before


async def test_dead_broker_disappears_from_routes(etcd: Etcd, start_namesrv: Any, prefix: str,
                                                  tmp_path: Path,
                                                  http: aiohttp.ClientSession) -> None:
    ns: Namesrv = start_namesrv(prefix)
    async with http.post(ns.url + "/v1/topics", json={"name": "t"}) as resp:
        assert resp.status == 201
    script = Path(__file__).with_name("broker_proc.py")
    child = spawn("broker", [sys.executable, str(script), etcd.endpoint, prefix, "broker-x",
                             "127.0.0.1:20000", "2"], tmp_path / "broker")
    try:
        async def masters() -> list[str | None]:
            _, route = await get(http, ns.url + "/v1/routes/t")
            return [b["master"] for b in route["brokers"]]
        async def masters_are(expected: list[str | None]) -> bool:
            return await masters() == expected
        await eventually(lambda: masters_are(["127.0.0.1:20000"]), timeout_s=10)
        await asyncio.sleep(3)  # past the TTL: the child's keep-alive holds the route
        assert await masters() == ["127.0.0.1:20000"]
        child.kill9()
        killed = time.monotonic()
        await eventually(lambda: masters_are([]), timeout_s=8)
        assert time.monotonic() - killed < 6  # TTL 2 s plus etcd's expiry sweep
    finally:
        child.kill9()

