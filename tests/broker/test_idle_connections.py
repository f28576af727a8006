"""Idle and stalled wire connections against real namesrv and broker processes.

A connection that completes no frame within the broker's `idle_timeout_ms` while
none of its requests runs is closed (a silent socket, a partial header); clients
that heartbeat keep theirs, and a producer idle between sends reconnects without
an error. 10,000 idle sockets are closed after the timeout while a real producer
and consumer are served throughout, and a new client is admitted afterwards.
"""
from __future__ import annotations

import asyncio
import json
import resource
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from ferry import Consumer, Producer

from tests.client.conftest import Mesh, start_mesh, unique
from tests.client.util import FAST, collect
from tests.support.procs import Etcd

pytestmark = pytest.mark.integration

IDLE_MS = 3000
IDLE_S = IDLE_MS / 1000
# The broker's sweep runs every IDLE_MS / 4 (at most 1 s): a close is at most this late,
# plus scheduling noise on a busy machine.
LATE_S = 5.0
FLOOD = 10_000
# The broker's default per-address cap is 1,000: the flood comes from 10 loopback addresses.
SOURCES = [f"127.0.0.{i}" for i in range(2, 12)]


@pytest.fixture(scope="module")
def idle_mesh(etcd: Etcd, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mesh]:
    m = start_mesh(etcd, tmp_path_factory.mktemp("idle"), ("broker-a",),
                   broker_env={"FERRY_BROKER_IDLE_TIMEOUT_MS": str(IDLE_MS)})
    yield m
    m.stop()


def _http(mesh: Mesh, path: str) -> Any:
    url = f"http://127.0.0.1:{mesh.brokers['broker-a'].http_port}{path}"
    with urllib.request.urlopen(url, timeout=5) as resp:
        return json.loads(resp.read())


def _limits(mesh: Mesh) -> dict[str, Any]:
    return dict(_http(mesh, "/v1/stats")["limits"])


async def _closed_after(reader: asyncio.StreamReader, started: float) -> float:
    """Seconds from `started` until the broker closes the connection."""
    assert await asyncio.wait_for(reader.read(), IDLE_S + LATE_S + 5) == b""
    return time.monotonic() - started


async def test_a_silent_socket_and_a_partial_header_are_closed_after_the_timeout(
        idle_mesh: Mesh) -> None:
    before = _limits(idle_mesh)["counts"]["connections_idle"]
    port = idle_mesh.brokers["broker-a"].port
    started = time.monotonic()
    silent_r, silent_w = await asyncio.open_connection("127.0.0.1", port)
    partial_r, partial_w = await asyncio.open_connection("127.0.0.1", port)
    partial_w.write(b"\x40\x00")  # 2 of the 8 bytes of a frame's prefix
    for reader in (silent_r, partial_r):
        assert IDLE_S - 0.05 <= await _closed_after(reader, started) <= IDLE_S + LATE_S
    for writer in (silent_w, partial_w):
        writer.close()
    limits = await asyncio.to_thread(_limits, idle_mesh)
    assert limits["counts"]["connections_idle"] == before + 2
    assert limits["settings"]["idle_timeout_ms"] == IDLE_MS


async def test_a_producer_idle_between_sends_reconnects_without_an_error(
        idle_mesh: Mesh) -> None:
    topic = unique("idle-producer")
    async with Producer(namesrv=idle_mesh.namesrv, retries=0) as producer:
        await producer.send_and_wait(topic, b"before")
        addr = idle_mesh.brokers["broker-a"].addr
        first = await producer._pool.get(addr)
        await asyncio.sleep(IDLE_S + LATE_S)
        assert first.closed  # the broker closed it; nothing was pending
        # retries=0: the send succeeds on its first try, on a new connection.
        await producer.send_and_wait(topic, b"after")
        assert await producer._pool.get(addr) is not first


async def test_a_heartbeating_consumer_idle_longer_than_the_timeout_keeps_its_connection(
        idle_mesh: Mesh) -> None:
    topic = unique("idle-consumer")
    addr = idle_mesh.brokers["broker-a"].addr
    async with Producer(namesrv=idle_mesh.namesrv) as producer, \
            Consumer(topic, group=unique("g"), namesrv=idle_mesh.namesrv,
                     auto_offset_reset="earliest", **FAST) as consumer:
        await producer.send_and_wait(topic, b"first")
        assert [r.body for r in (await collect([consumer], 1))[0]] == [b"first"]
        conn = await consumer._pool.get(addr)
        await asyncio.sleep(2.5 * IDLE_S)  # nothing to consume: heartbeats and empty pulls
        assert not conn.closed and await consumer._pool.get(addr) is conn
        await producer.send_and_wait(topic, b"second")
        assert [r.body for r in (await collect([consumer], 1))[0]] == [b"second"]


class _Idle(asyncio.Protocol):
    """A connection that never sends a byte; records when the broker closed it."""

    def __init__(self) -> None:
        self.opened = time.monotonic()
        self.lost: asyncio.Future[float] = asyncio.get_running_loop().create_future()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.lost.done():
            self.lost.set_result(time.monotonic())


def _raise_fd_limit(need: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft >= need:
        return
    if hard != resource.RLIM_INFINITY and hard < need:
        pytest.skip(f"needs {need} open files, the hard limit is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))


async def _open_flood(port: int) -> list[_Idle]:
    loop = asyncio.get_running_loop()
    idle: list[_Idle] = []

    async def one(i: int) -> None:
        # Timed from before the connect: under load this process may run the protocol
        # factory well after the broker accepted (and started its idle clock).
        started = time.monotonic()
        _, proto = await loop.create_connection(_Idle, "127.0.0.1", port,
                                                local_addr=(SOURCES[i % len(SOURCES)], 0))
        proto.opened = started
        idle.append(proto)

    for start in range(0, FLOOD, 500):
        await asyncio.gather(*(one(i) for i in range(start, min(FLOOD, start + 500))))
    return idle


@pytest.mark.slow
async def test_ten_thousand_idle_connections_are_closed_and_a_real_client_is_served(
        idle_mesh: Mesh) -> None:
    _raise_fd_limit(FLOOD + 2048)
    topic = unique("idle-flood")
    port = idle_mesh.brokers["broker-a"].port
    before = (await asyncio.to_thread(_limits, idle_mesh))["counts"]
    sent: list[bytes] = []
    async with Producer(namesrv=idle_mesh.namesrv, retries=0) as producer, \
            Consumer(topic, group=unique("g"), namesrv=idle_mesh.namesrv,
                     auto_offset_reset="earliest", **FAST) as consumer:
        await producer.send_and_wait(topic, b"warm-up")
        sent.append(b"warm-up")
        stop = asyncio.Event()

        async def keep_sending() -> None:  # every send must succeed on its first try
            n = 0
            while not stop.is_set():
                body = f"during-{n}".encode()
                await producer.send_and_wait(topic, body)
                sent.append(body)
                n += 1
                await asyncio.sleep(0.05)

        sender = asyncio.create_task(keep_sending())
        idle = await _open_flood(port)
        assert len(idle) == FLOOD
        closed = await asyncio.wait_for(asyncio.gather(*(c.lost for c in idle)),
                                        IDLE_S + LATE_S + 60)
        lived = [at - c.opened for c, at in zip(idle, closed, strict=True)]
        # The real clients hold a few connections, so the last few of the flood meet the
        # 10,000 cap and are refused at once; every other one lived the whole timeout.
        refused = [t for t in lived if t < IDLE_S / 2]
        assert len(refused) <= 10
        outside = sorted(t for t in lived if t >= IDLE_S / 2
                         and not IDLE_S - 0.05 <= t <= IDLE_S + LATE_S + 30)
        assert not outside, f"{len(outside)} lived outside the timeout: {outside[:5]}..."
        stop.set()
        await sender  # re-raises a failed send
        assert len(sent) > 20
        got = (await collect([consumer], len(sent), timeout_s=60))[0]
        assert sorted(r.body for r in got) == sorted(sent)
    limits = await asyncio.to_thread(_limits, idle_mesh)
    assert limits["counts"]["connections_idle"] - before["connections_idle"] >= FLOOD - 10
    assert limits["connections"] < 10
    # A new client is admitted once the idle ones are gone.
    async with Producer(namesrv=idle_mesh.namesrv, retries=0) as late:
        await late.send_and_wait(topic, b"after")
