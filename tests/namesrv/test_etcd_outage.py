"""namesrv while etcd is away: not ready before the first load, stale-but-serving after."""
from __future__ import annotations

from pathlib import Path
from typing import Any
from uuid import uuid4

import aiohttp
import pytest

from tests.routing.etcd_restart import restart_etcd
from tests.support.procs import free_port, spawn, start_etcd

from .conftest import Namesrv, eventually, wait_ready

pytestmark = pytest.mark.integration


async def status_of(http: aiohttp.ClientSession, url: str) -> tuple[int, Any]:
    async with http.get(url) as resp:
        return resp.status, await resp.json()


async def test_waits_for_etcd_then_survives_an_outage(tmp_path: Path,
                                                      http: aiohttp.ClientSession) -> None:
    import sys
    own = start_etcd(tmp_path / "etcd")
    own.proc.stop()  # namesrv starts while etcd is down
    port, prefix = free_port(), f"/t-{uuid4().hex}/"
    ns = Namesrv(spawn("namesrv", [sys.executable, "-m", "ferry_namesrv", "--port", str(port),
                                   "--etcd", own.endpoint, "--etcd-prefix", prefix],
                       tmp_path / "ns"), port)
    try:
        async def answers(path: str, status: int) -> bool:
            try:
                return (await status_of(http, ns.url + path))[0] == status
            except aiohttp.ClientError:
                return False
        await eventually(lambda: answers("/healthz", 200), timeout_s=15)
        status, body = await status_of(http, ns.url + "/readyz")
        assert status == 503 and body["error"]["type"] == "BusyError"
        assert (await status_of(http, ns.url + "/v1/topics"))[0] == 503

        await restart_etcd(own, tmp_path / "etcd")
        wait_ready(ns)
        async with http.post(ns.url + "/v1/topics", json={"name": "t", "queues": 2}) as resp:
            assert resp.status == 201

        own.proc.stop()  # etcd goes away: reads keep answering from the cache
        await eventually(lambda: _not_watching(http, ns), timeout_s=10)
        assert (await status_of(http, ns.url + "/v1/routes/t"))[0] == 200
        status, body = await status_of(http, ns.url + "/v1/topics/t")
        assert status == 200 and body["queues"] == 2
        async with http.put(ns.url + "/v1/topics/t", json={"queues": 3}) as resp:
            assert resp.status == 503  # writes need etcd: a clear, retriable error
            assert (await resp.json())["error"]["code"] == 2

        await restart_etcd(own, tmp_path / "etcd")
        async def watching() -> bool:
            return bool((await status_of(http, ns.url + "/readyz"))[1]["watching"])
        await eventually(watching, timeout_s=15)
        async with http.put(ns.url + "/v1/topics/t", json={"queues": 3}) as resp:
            assert resp.status == 200
    finally:
        ns.proc.stop()
        own.proc.stop()
    assert "Traceback" not in ns.proc.log()


async def _not_watching(http: aiohttp.ClientSession, ns: Namesrv) -> bool:
    status, body = await status_of(http, ns.url + "/readyz")
    return status == 200 and not body["watching"]
