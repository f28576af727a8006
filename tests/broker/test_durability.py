"""Crash safety and etcd registration: kill -9 under load, lease expiry."""
from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import aetcd
import pytest

from tests.broker.conftest import Broker, start_broker, unique_prefix
from tests.broker.wire_client import WireClient, message
from tests.support.procs import Etcd

pytestmark = pytest.mark.integration

Acked = dict[tuple[int, int], bytes]  # (queue_id, queue_offset) -> body


async def _produce(c: WireClient, worker: int, acked: Acked, stop: asyncio.Event) -> None:
    n = 0
    try:
        while not stop.is_set():
            qid = (worker + n) % 4
            bodies = [f"w{worker}-{n}-{i}".encode() for i in range(8)]
            ack = await c.send("crash", qid, [message(b) for b in bodies])
            for i, body in enumerate(bodies):
                acked[(qid, ack["queue_offset"] + i)] = body
            n += 1
    except (TimeoutError, ConnectionError, OSError):
        return  # the broker died under us: what was acked so far is recorded


async def _load_then(b: Broker, stop_broker: str) -> Acked:
    """Four producers send batches for a second; then the broker is stopped or killed."""
    clients = [await b.client() for _ in range(4)]
    acked: Acked = {}
    stop = asyncio.Event()
    producers = [asyncio.create_task(_produce(c, w, acked, stop)) for w, c in enumerate(clients)]
    await asyncio.sleep(1.0)
    if stop_broker == "kill9":
        b.proc.kill9()
    else:
        b.proc.popen.terminate()
        await asyncio.to_thread(b.proc.popen.wait, 15)
    stop.set()
    await asyncio.wait_for(asyncio.gather(*producers), 10)
    for c in clients:
        await c.close()
    assert len(acked) > 100, "the load did not get going"
    return acked


async def _read_back(b: Broker, acked: Acked) -> None:
    c = await b.client()
    for qid in range(4):
        wanted = {off: body for (q, off), body in acked.items() if q == qid}
        got: dict[int, bytes] = {}
        offset = 0
        while offset <= max(wanted, default=-1):
            fields, msgs = await c.pull("crash", qid, offset, max_count=1024)
            assert msgs, f"queue {qid}: nothing at {offset}, acked up to {max(wanted)}"
            got.update((m.queue_offset, m.body) for m in msgs)
            offset = fields["next_offset"]
        assert {o: got.get(o) for o in wanted} == wanted
    await c.close()


@pytest.mark.parametrize("how", ["kill9", "sigterm"])
async def test_stop_under_load_loses_no_acked_message(tmp_path: Path, etcd: Etcd,
                                                      how: str) -> None:
    data = tmp_path / "data"
    b = start_broker(tmp_path / "one", etcd, data_dir=data)
    acked = await _load_then(b, how)
    if how == "sigterm":
        assert b.proc.popen.returncode == 0, b.proc.log()[-3000:]
        assert "broker stopped" in b.proc.log()
    b2 = start_broker(tmp_path / "two", etcd, data_dir=data)
    try:
        await _read_back(b2, acked)
    finally:
        b2.proc.stop()


async def _broker_key(etcd: Etcd, prefix: str) -> dict[str, Any] | None:
    async with aetcd.Client(host=etcd.host, port=etcd.port) as client:
        got = await client.get(f"{prefix}brokers/DefaultCluster/broker-a/0".encode())
        return None if got is None else json.loads(got.value)


async def _wait_key(etcd: Etcd, prefix: str, present: bool, timeout_s: float) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        if (await _broker_key(etcd, prefix) is not None) == present:
            return time.monotonic() - started
        await asyncio.sleep(0.1)
    raise AssertionError(f"broker key still {'absent' if present else 'present'} "
                         f"after {timeout_s}s")


async def test_registers_in_etcd_and_lease_expires_after_kill9(tmp_path: Path,
                                                               etcd: Etcd) -> None:
    prefix = unique_prefix()
    b: Broker = start_broker(tmp_path, etcd, prefix=prefix, FERRY_BROKER_LEASE_TTL_S="2")
    try:
        info = await _broker_key(etcd, prefix)
        assert info is not None and info["addr"] == f"127.0.0.1:{b.port}"
        assert info["http_addr"] == f"127.0.0.1:{b.http_port}"
        c = await b.client()
        await c.send("registered", 0, [message(b"x")])  # auto-creates the topic
        await c.close()
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            info = await _broker_key(etcd, prefix)
            if info and "registered" in info["topics"]:
                break
            await asyncio.sleep(0.1)
        assert info is not None and info["topics"].get("registered") == 8
        async with aetcd.Client(host=etcd.host, port=etcd.port) as client:
            topic = await client.get(f"{prefix}topics/registered".encode())
            assert topic is not None and json.loads(topic.value)["queues"] == 8
        await asyncio.sleep(2.5)  # longer than the TTL: the keep-alive holds the key
        assert await _broker_key(etcd, prefix) is not None
        b.proc.kill9()
        waited_s = await _wait_key(etcd, prefix, present=False, timeout_s=10)
        assert waited_s < 6
    finally:
        b.proc.stop()


async def test_clean_stop_removes_the_key_at_once(tmp_path: Path, etcd: Etcd) -> None:
    prefix = unique_prefix()
    b = start_broker(tmp_path, etcd, prefix=prefix)  # default 30 s lease
    assert await _broker_key(etcd, prefix) is not None
    b.proc.stop()
    assert b.proc.popen.returncode == 0
    assert await _broker_key(etcd, prefix) is None
