"""Integration fixtures: a real mesh (etcd, namesrv, broker processes) plus scheduler processes.

`start_scheduler` runs `python -m ferry_delay_scheduler` on free ports over a
`tests.client.conftest.Mesh`; `DelaySender` sends delayed messages with the
Producer (`deliver_at_ms`); `Collector` long-polls
every queue of a topic and records when each message arrived.
"""
from __future__ import annotations

import asyncio
import json
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from ferry import Message, Producer
from ferry.client.core.connection import ConnectionPool
from ferry.client.core.namesrv import NamesrvClient
from ferry.codec import StoredMessage, iter_records
from ferry.wire import RequestCode

from tests.client.conftest import Mesh, start_mesh
from tests.support.procs import Etcd, Proc, free_port, spawn, wait_until_ready

READY_TIMEOUT_S = 30.0


@dataclass
class SchedulerProc:
    name: str
    proc: Proc
    http_port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def stats(self) -> dict[str, Any]:
        with urllib.request.urlopen(self.url + "/v1/stats", timeout=5) as resp:
            return json.loads(resp.read())

    def post(self, path: str) -> tuple[int, dict[str, Any]]:
        req = urllib.request.Request(self.url + path, method="POST", data=b"")
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())


def start_scheduler(mesh: Mesh, name: str, *, http_port: int | None = None,
                    env: dict[str, str] | None = None) -> SchedulerProc:
    """Start (or restart, on its old data directory) scheduler `name`; waits for /readyz."""
    port = http_port or free_port()
    workdir = mesh.workdir / name
    full_env = {
        "FERRY_DELAY_SCHEDULER_HOST": "127.0.0.1", "FERRY_DELAY_SCHEDULER_HTTP_PORT": str(port),
        "FERRY_DELAY_SCHEDULER_DATA_DIR": str(workdir / "data"),
        "FERRY_DELAY_SCHEDULER_NAMESRV": mesh.namesrv,
        "FERRY_DELAY_SCHEDULER_ETCD": mesh.etcd.endpoint,
        "FERRY_DELAY_SCHEDULER_ETCD_PREFIX": mesh.prefix,
        "FERRY_DELAY_SCHEDULER_INSTANCE_ID": name,
        "FERRY_DELAY_SCHEDULER_LEADER_TTL_S": "3",
        "FERRY_DELAY_SCHEDULER_ROUTE_POLL_MS": "300",
        "FERRY_DELAY_SCHEDULER_PULL_MAX_WAIT_MS": "500",
        "FERRY_DELAY_SCHEDULER_SEGMENT_BYTES": str(16 << 20),
        **(env or {})}
    proc = spawn(name, [sys.executable, "-m", "ferry_delay_scheduler"], workdir, full_env)
    wait_until_ready(proc, f"http://127.0.0.1:{port}/readyz", READY_TIMEOUT_S)
    return SchedulerProc(name, proc, port)


def wait_for(check: Any, timeout_s: float = 30.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not met within {timeout_s}s")
        time.sleep(0.05)


async def until(check: Any, timeout_s: float = 30.0, what: str = "condition") -> None:
    """`wait_for` for checks that need the event loop to run (a Collector fills in)."""
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not met within {timeout_s}s")
        await asyncio.sleep(0.05)


@pytest.fixture(scope="module")
def delay_mesh(etcd: Etcd, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mesh]:
    m = start_mesh(etcd, tmp_path_factory.mktemp("delay-mesh"), ("broker-a",))
    yield m
    m.stop()


@pytest.fixture
def fresh_delay_mesh(etcd: Etcd, tmp_path: Path) -> Iterator[Mesh]:
    m = start_mesh(etcd, tmp_path / "mesh", ("broker-a",))
    yield m
    m.stop()


class DelaySender:
    """Sends delayed messages through the real Producer (`deliver_at_ms`), in batches."""

    def __init__(self, namesrv: str) -> None:
        self.producer = Producer(namesrv=namesrv)
        self._started = False

    async def close(self) -> None:
        if self._started:
            await self.producer.stop()

    async def send(self, topic: str, items: list[tuple[bytes, int]], batch: int = 500
                   ) -> list[bytes]:
        """Send (body, deliver_at_ms) pairs; their message ids, in order."""
        if not self._started:
            await self.producer.start()
            self._started = True
        ids: list[bytes] = []
        for start in range(0, len(items), batch):
            msgs = [Message(body, deliver_at_ms=at) for body, at in items[start:start + batch]]
            results = await self.producer.send_batch(topic, msgs)
            ids += [bytes.fromhex(r.msg_id) for r in results]
        return ids


@dataclass
class Collector:
    """Long-polls every queue of a topic from offset 0; `got` holds (receive ms, record)."""

    namesrv: str
    topic: str
    got: list[tuple[int, StoredMessage]] = field(default_factory=list)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)

    async def start(self) -> None:
        self.pool = ConnectionPool()
        self.client = NamesrvClient(self.namesrv)
        route = await self.client.get_route(self.topic, create=True)
        for b in route.brokers:
            for q in range(b.queues):
                self._tasks.append(asyncio.create_task(self._poll(b.name, q)))

    async def _poll(self, broker: str, qid: int) -> None:
        offset = 0
        while True:
            try:
                route = await self.client.get_route(self.topic)
                addr = route.broker_addr(broker)
                if addr is None:
                    await asyncio.sleep(0.2)
                    continue
                resp = await self.pool.request(addr, RequestCode.PULL, {
                    "group": "collector", "topic": self.topic, "queue_id": qid, "offset": offset,
                    "max_count": 1000, "max_wait_ms": 500, "tags": None, "sql": None},
                    timeout_ms=5000)
                now = int(time.time() * 1000)
                if resp.fields.get("status") == "FOUND":
                    self.got += [(now, r) for r in iter_records(resp.body)]
                offset = int(resp.fields.get("next_offset", offset))
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - a restarting broker: poll again
                await asyncio.sleep(0.2)

    async def wait_count(self, n: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while len({r.msg_id for _, r in self.got}) < n:
            if time.monotonic() > deadline:
                raise AssertionError(f"{len(self.got)} of {n} messages arrived in {timeout_s}s")
            await asyncio.sleep(0.05)

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.pool.close()
        await self.client.close()
