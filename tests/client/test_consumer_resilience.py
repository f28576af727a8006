"""A consumer's membership loop survives unexpected errors instead of dying silently."""
from __future__ import annotations

import asyncio

import pytest
from ferry import Consumer, Producer

from tests.client.conftest import Mesh, unique
from tests.client.util import FAST, collect

pytestmark = pytest.mark.integration


async def test_rebalance_loop_outlives_an_unexpected_error(mesh: Mesh) -> None:
    topic = unique("resilient")
    async with Consumer(topic, group=unique("g"), namesrv=mesh.namesrv,
                        auto_offset_reset="earliest", **FAST) as consumer:
        real = consumer._assignment.heartbeat_and_rebalance
        calls = {"failed": 0, "after": 0}

        async def flaky(**kwargs: bool) -> None:
            if not calls["failed"]:
                calls["failed"] += 1
                raise RuntimeError("a bug somewhere below the membership loop")
            calls["after"] += 1
            await real(**kwargs)

        consumer._assignment.heartbeat_and_rebalance = flaky  # type: ignore[method-assign]
        for _ in range(100):
            if calls["after"] >= 2:
                break
            await asyncio.sleep(0.1)
        assert calls == {"failed": 1, "after": calls["after"]} and calls["after"] >= 2
        async with Producer(namesrv=mesh.namesrv) as producer:
            for i in range(20):
                await producer.send_and_wait(topic, f"r{i}".encode())
        got = (await collect([consumer], 20))[0]
    assert sorted(r.body for r in got) == sorted(f"r{i}".encode() for i in range(20))
