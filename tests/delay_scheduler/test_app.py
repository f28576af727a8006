"""The scheduler process's logic against a stand-in broker (real store, real wire protocol).

The same behaviours run against real brokers in test_integration.py.
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from ferry.codec import DELIVER_AT_MS, ORIGIN_OFFSET, RECONSUME_TIMES, MessageFlag
from ferry.names import SCHEDULE_TOPIC
from ferry_delay_scheduler.app import SchedulerApp
from ferry_delay_scheduler.config import SchedulerConfig
from ferry_delay_scheduler.ingest import GROUP

from tests.delay_scheduler.fake_mesh import FakeBroker, FakeNamesrv


@pytest.fixture
async def broker(tmp_path: Path) -> AsyncIterator[FakeBroker]:
    b = FakeBroker("broker-a", tmp_path / "broker")
    await b.start()
    yield b
    await b.stop()


@pytest.fixture
async def namesrv(broker: FakeBroker) -> AsyncIterator[FakeNamesrv]:
    n = FakeNamesrv([broker])
    await n.start()
    yield n
    await n.stop()


def _config(tmp_path: Path, namesrv: FakeNamesrv) -> SchedulerConfig:
    return SchedulerConfig(http_port=0, data_dir=str(tmp_path / "sched"), namesrv=namesrv.addr,
                           etcd="", segment_bytes=8 << 20, route_poll_ms=100,
                           pull_max_wait_ms=200, progress_interval_ms=100, retry_backoff_ms=100)


async def _until(check, timeout_s: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.02)


async def _post(app: SchedulerApp, path: str) -> tuple[int, dict]:  # type: ignore[type-arg]
    async with aiohttp.ClientSession() as s, s.post(f"http://127.0.0.1:{app.port}{path}") as r:
        return r.status, await r.json()


async def test_delivers_when_due_never_early_with_id_and_origin(
        tmp_path: Path, broker: FakeBroker, namesrv: FakeNamesrv) -> None:
    app = SchedulerApp(_config(tmp_path, namesrv))
    await app.start()
    try:
        due = int(time.time() * 1000) + 300
        msg_id = broker.schedule("orders", b"hello", due, queue=2, reconsume_times=3)
        await _until(lambda: len(broker.delivered("orders")) == 1)
        got = broker.delivered("orders")[0]
        arrived_ms = broker.arrivals[0][0] * 1000
        assert arrived_ms >= due
        assert got.msg_id == msg_id and got.body == b"hello"
        assert (got.tags, got.keys) == ("tagA", "k1")
        assert not got.flags & MessageFlag.DELAY
        props = got.properties
        assert props[DELIVER_AT_MS] == str(due) and props["user"] == "u1"
        assert props[ORIGIN_OFFSET] == "broker-a/2/0"
        assert props[RECONSUME_TIMES] == "3"
        await _until(lambda: broker.offsets.get((GROUP, SCHEDULE_TOPIC, 2)) == 1)
        # The stand-in broker stores the message before the scheduler reads its answer,
        # so the counter may trail the arrival by a moment.
        await _until(lambda: app.stats_document()["delivered"] == 1)
        assert app.stats_document()["role"] == "leader"
    finally:
        await app.stop()


async def test_cancel_before_due_after_due_and_unknown(
        tmp_path: Path, broker: FakeBroker, namesrv: FakeNamesrv) -> None:
    app = SchedulerApp(_config(tmp_path, namesrv))
    await app.start()
    try:
        now = int(time.time() * 1000)
        keep = broker.schedule("t", b"keep", now + 200)
        drop = broker.schedule("t", b"drop", now + 400)
        status, body = await _post(app, f"/v1/delayed/{drop.hex()}/cancel")
        assert (status, body["cancelled"]) == (200, True)
        await _until(lambda: len(broker.delivered("t")) == 1)
        await asyncio.sleep(0.6)
        assert [m.body for m in broker.delivered("t")] == [b"keep"]
        status, body = await _post(app, f"/v1/delayed/{keep.hex()}/cancel")
        assert status == 409
        assert body["error"]["code"] == 21 and body["error"]["type"] == "AlreadyDeliveredError"
        assert "already delivered at" in body["error"]["message"]
        started = time.monotonic()
        status, body = await _post(app, f"/v1/delayed/{'ab' * 16}/cancel")
        assert status == 404 and body["error"]["type"] == "MessageNotFoundError"
        assert time.monotonic() - started >= 1.5  # it waited for the pull loop first
        status, body = await _post(app, "/v1/delayed/xyz/cancel")
        assert status == 400 and body["error"]["code"] == 4
    finally:
        await app.stop()


async def test_restart_delivers_what_was_pending_and_not_what_was_delivered(
        tmp_path: Path, broker: FakeBroker, namesrv: FakeNamesrv) -> None:
    cfg = _config(tmp_path, namesrv)
    app = SchedulerApp(cfg)
    await app.start()
    now = int(time.time() * 1000)
    broker.schedule("r", b"early", now + 100)
    broker.schedule("r", b"later", now + 1500)
    try:
        await _until(lambda: len(broker.delivered("r")) == 1)
        await _until(lambda: app.stats_document()["taken"] == 2)
    finally:
        await app.stop()
    again = SchedulerApp(cfg)
    await again.start()
    try:
        await _until(lambda: len(broker.delivered("r")) == 2)
        arrivals = [m.body for m in broker.delivered("r")]
        assert arrivals == [b"early", b"later"]
        assert broker.arrivals[-1][0] * 1000 >= now + 1500
    finally:
        await again.stop()


async def test_refused_delivery_is_retried(tmp_path: Path, broker: FakeBroker,
                                           namesrv: FakeNamesrv) -> None:
    app = SchedulerApp(_config(tmp_path, namesrv))
    broker.refuse_deliveries = True
    await app.start()
    try:
        broker.schedule("x", b"m", int(time.time() * 1000) + 50)
        await _until(lambda: app.stats.delivery_errors >= 1)
        broker.refuse_deliveries = False
        await _until(lambda: len(broker.delivered("x")) == 1)
    finally:
        await app.stop()


async def test_http_surface(tmp_path: Path, broker: FakeBroker, namesrv: FakeNamesrv) -> None:
    app = SchedulerApp(_config(tmp_path, namesrv))
    await app.start()
    try:
        async with aiohttp.ClientSession() as s:
            base = f"http://127.0.0.1:{app.port}"
            for path in ("/healthz", "/readyz", "/openapi.json", "/v1/stats"):
                async with s.get(base + path) as r:
                    assert r.status == 200, path
            async with s.get(base + "/v1/stats") as r:
                stats = await r.json()
            for key in ("pending", "due_next_minute", "delivered", "duplicates_after_crash",
                        "cancelled", "lateness_ms", "role"):
                assert key in stats
            async with s.get(base + "/nope") as r:
                assert r.status == 404 and (await r.json())["error"]["code"] == 4
    finally:
        await app.stop()


async def test_restart_after_a_torn_bucket_file_loses_nothing(
        tmp_path: Path, broker: FakeBroker, namesrv: FakeNamesrv) -> None:
    cfg = _config(tmp_path, namesrv)
    app = SchedulerApp(cfg)
    await app.start()
    due = int(time.time() * 1000) + 2500
    ids = {broker.schedule("torn", b"m%d" % i, due) for i in range(20)}
    try:
        await _until(lambda: app.stats.taken == 20)
    finally:
        await app.stop()
    buckets = list((tmp_path / "sched" / "wheel").glob("*.bkt"))
    assert buckets
    for path in buckets:
        with open(path, "ab") as f:
            f.write(b"\x07" * 13)  # half an entry, as a crash in the middle of a write leaves
    again = SchedulerApp(cfg)
    await again.start()
    try:
        await _until(lambda: len(broker.delivered("torn")) == 20)
        assert {m.msg_id for m in broker.delivered("torn")} == ids
        assert all(t * 1000 >= due for t, _ in broker.arrivals)
    finally:
        await again.stop()
