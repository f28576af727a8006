"""Fixtures for namesrv tests: real `python -m ferry_namesrv` processes on free ports."""
from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from uuid import uuid4

import aiohttp
import pytest

from tests.support.procs import Etcd, Proc, free_port, spawn, wait_until_ready


@dataclass
class Namesrv:
    proc: Proc
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def wait_ready(ns: Namesrv, timeout_s: float = 20.0) -> None:
    """Block until /readyz answers 200 (the cache is loaded) or fail with the log."""
    wait_until_ready(ns.proc, ns.url + "/readyz", timeout_s)


NamesrvFactory = Callable[..., Namesrv]


def _factory(etcd: Etcd, workdir: Path, started: list[Namesrv]) -> NamesrvFactory:
    def start(prefix: str, port: int | None = None, **env: str) -> Namesrv:
        port = port or free_port()
        argv = [sys.executable, "-m", "ferry_namesrv", "--port", str(port),
                "--etcd", etcd.endpoint, "--etcd-prefix", prefix, "--log-level", "DEBUG"]
        name = f"namesrv-{port}"
        proc = spawn(name, argv, workdir / name,
                     env={f"FERRY_NAMESRV_{k.upper()}": v for k, v in env.items()})
        ns = Namesrv(proc, port)
        started.append(ns)
        wait_ready(ns)
        return ns
    return start


@pytest.fixture
def start_namesrv(etcd: Etcd, tmp_path: Path) -> Iterator[NamesrvFactory]:
    """Start namesrv processes for one test; all are stopped at its end."""
    started: list[Namesrv] = []
    yield _factory(etcd, tmp_path, started)
    for ns in started:
        ns.proc.stop()


@pytest.fixture(scope="module")
def module_prefix() -> str:
    return f"/t-{uuid4().hex}/"


@pytest.fixture(scope="module")
def namesrv(etcd: Etcd, tmp_path_factory: pytest.TempPathFactory,
            module_prefix: str) -> Iterator[Namesrv]:
    """One namesrv shared by a module's tests (auto-create on, 4 default queues)."""
    started: list[Namesrv] = []
    ns = _factory(etcd, tmp_path_factory.mktemp("namesrv"), started)(
        module_prefix, default_queues="4")
    yield ns
    ns.proc.stop()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=15)) as session:
        yield session


async def eventually(check: Callable[[], object], timeout_s: float = 10.0) -> None:
    """Await `check()` (a coroutine function) until it returns truthy, bounded."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        result = check()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return
        if loop.time() > deadline:
            raise AssertionError(f"condition not met within {timeout_s}s")
        await asyncio.sleep(0.1)
