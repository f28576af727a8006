"""The broker under failure: a failed store, a failing stop step, etcd started after it."""
from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from ferry.errors import BusyError, StoreError, StoreUnavailableError
from ferry.store import MessageStore, StoreConfig
from ferry.wire import RequestCode
from ferry_broker.app import OFFSETS_FILE, BrokerApp
from ferry_broker.config import BrokerConfig

from tests.broker.conftest import Broker, wait_ready
from tests.broker.wire_client import WireClient, message
from tests.support.procs import Proc, free_port, spawn, wait_for_http


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


@pytest.fixture
async def app(tmp_path: Path) -> AsyncIterator[BrokerApp]:
    config = BrokerConfig(data_dir=str(tmp_path / "data"), etcd="", port=free_port(),
                          segment_bytes=64 << 20,
                          http_port=free_port())
    broker = BrokerApp(config)
    await broker.start()
    for _ in range(100):
        if broker.ready:
            break
        await asyncio.sleep(0.02)
    yield broker
    await broker.stop()


async def test_a_failed_store_answers_sends_retriable_and_leaves_readiness(
        app: BrokerApp) -> None:
    ready_url = f"http://127.0.0.1:{app.config.http_port}/readyz"
    c = await WireClient.connect("127.0.0.1", app.config.port)
    await c.send("fail-store", 0, [message(b"before")])
    assert await asyncio.to_thread(_status, ready_url) == 200
    assert app.ctx is not None
    app.ctx.store.close()  # the store refuses every append from now on, like after EIO
    resp = await c.request(RequestCode.SEND, {"topic": "fail-store", "queue_id": 0},
                           b"")  # empty body is refused before the store: still a 4
    assert resp.error == 4
    with pytest.raises(StoreUnavailableError) as info:
        await c.send("fail-store", 0, [message(b"after")])
    assert info.value.retriable and app.config.data_dir not in str(info.value)
    assert await asyncio.to_thread(_status, ready_url) == 503
    with pytest.raises(StoreUnavailableError):  # sticky, and the broker keeps answering
        await c.send("fail-store", 1, [message(b"again")])
    await c.close()


async def test_store_errors_reach_clients_without_paths(app: BrokerApp) -> None:
    assert app.ctx is not None
    c = await WireClient.connect("127.0.0.1", app.config.port)
    app.ctx.store.close()
    resp = await c.request(RequestCode.PULL, {"group": "g", "topic": "closed", "queue_id": 0,
                                              "offset": 0})
    if resp.error:  # a closed store may or may not refuse reads; if it does, no detail
        assert resp.error == StoreError.code and app.config.data_dir not in resp.message
    await c.close()


async def test_stop_saves_offsets_and_closes_the_store_when_a_step_fails(
        app: BrokerApp) -> None:
    c = await WireClient.connect("127.0.0.1", app.config.port)
    await c.send("stop-safe", 0, [message(b"x")])
    await c.call(RequestCode.COMMIT_OFFSET, {"group": "g1", "topic": "stop-safe",
                                             "queue_id": 0, "offset": 1})
    await c.close()

    async def broken_unregister() -> None:
        raise RuntimeError("etcd client in a bad state")

    app.registration.unregister = broken_unregister  # type: ignore[method-assign]
    await app.stop()
    data = Path(app.config.data_dir)
    saved = json.loads((data / OFFSETS_FILE).read_text())
    assert saved["offsets"]["g1"]["stop-safe"]["0"] == 1
    with MessageStore(StoreConfig(root_dir=str(data), commitlog_segment_bytes=64 << 20)) as store:
        assert store.recovery.clean


def _start_etcd_on(workdir: Path, port: int) -> Proc:
    binary = shutil.which("etcd")
    assert binary is not None
    url, purl = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{free_port()}"
    proc = spawn("etcd", [
        binary, "--name", "late", "--data-dir", str(workdir / "etcd-data"),
        "--listen-client-urls", url, "--advertise-client-urls", url,
        "--listen-peer-urls", purl, "--initial-advertise-peer-urls", purl,
        "--initial-cluster", f"late={purl}", "--log-level", "error",
    ], workdir, env={"ETCD_UNSUPPORTED_ARCH": os.uname().machine})
    wait_for_http(f"{url}/health", b'"health":"true"')
    return proc


@pytest.mark.integration
async def test_broker_started_before_etcd_serves_and_registers_once_etcd_is_up(
        tmp_path: Path) -> None:
    etcd_port, port, http_port = free_port(), free_port(), free_port()
    env = {"FERRY_BROKER_PORT": str(port), "FERRY_BROKER_HTTP_PORT": str(http_port),
           "FERRY_BROKER_DATA_DIR": str(tmp_path / "data"),
           "FERRY_BROKER_ETCD": f"127.0.0.1:{etcd_port}",
           "FERRY_BROKER_ETCD_PREFIX": "/ferry-late-etcd/",
           "FERRY_BROKER_SEGMENT_BYTES": str(64 << 20)}
    proc = spawn("broker", [sys.executable, "-m", "ferry_broker"], tmp_path, env=env)
    broker = Broker(proc, port, http_port, tmp_path / "data", env)
    etcd = None
    try:
        await asyncio.to_thread(wait_for_http, broker.http + "/healthz", b"ok")
        assert proc.alive()
        assert await asyncio.to_thread(_status, broker.http + "/readyz") == 503
        c = await broker.client()
        with pytest.raises(BusyError):  # topic config unknown yet: no guessing a queue count
            await c.send("late-etcd", 0, [message(b"early")])
        await c.close()
        await asyncio.sleep(1.0)  # a few failed attempts
        assert proc.alive()
        etcd = await asyncio.to_thread(_start_etcd_on, tmp_path / "etcd", etcd_port)
        await asyncio.to_thread(wait_ready, broker, 30.0)
        c = await broker.client()
        await c.send("late-etcd", 0, [message(b"hello")])
        await c.close()
    finally:
        proc.stop()
        if etcd is not None:
            etcd.stop()


async def test_a_stalled_flush_refuses_sends_until_it_moves_again(app: BrokerApp) -> None:
    assert app.ctx is not None
    ready_url = f"http://127.0.0.1:{app.config.http_port}/readyz"
    c = await WireClient.connect("127.0.0.1", app.config.port)
    app.ctx.health.set_stalled("commit log not flushed for 30 s")  # as the watchdog does
    with pytest.raises(StoreUnavailableError):
        await c.send("stall", 0, [message(b"x")])
    assert await asyncio.to_thread(_status, ready_url) == 503
    app.ctx.health.set_stalled(None)
    await c.send("stall", 0, [message(b"y")])
    assert await asyncio.to_thread(_status, ready_url) == 200
    await c.close()
