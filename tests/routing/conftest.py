"""Fixtures for routing tests: a registry on the session etcd under a prefix of its own."""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from uuid import uuid4

import pytest
from ferry.routing import EtcdRegistry, RegistryCache

from tests.support.procs import Etcd


@pytest.fixture
def prefix() -> str:
    return f"/t-{uuid4().hex}/"


@pytest.fixture
async def registry(etcd: Etcd, prefix: str) -> AsyncIterator[EtcdRegistry]:
    reg = EtcdRegistry(etcd.endpoint, prefix=prefix)
    await reg.start()
    yield reg
    await reg.stop()


@pytest.fixture
async def cache(registry: EtcdRegistry) -> AsyncIterator[RegistryCache]:
    c = RegistryCache(registry)
    await c.start()
    yield c
    await c.stop()


async def eventually(check: Callable[[], bool], timeout_s: float = 10.0) -> None:
    """Wait until `check()` is true, polling; fail after `timeout_s`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not check():
        if loop.time() > deadline:
            raise AssertionError(f"condition not met within {timeout_s}s")
        await asyncio.sleep(0.05)
