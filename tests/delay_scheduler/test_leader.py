"""Leader election on a real etcd: one leader at a time; a standby takes over."""
from __future__ import annotations

import asyncio
import contextlib
import uuid

import pytest
from ferry_delay_scheduler.leader import LeaderElection

from tests.support.procs import Etcd

pytestmark = pytest.mark.integration


async def _until(check, timeout_s: float) -> None:  # type: ignore[no-untyped-def]
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not check():
        assert loop.time() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)


async def test_one_leader_and_takeover_on_resign(etcd: Etcd) -> None:
    prefix = f"/t-{uuid.uuid4().hex[:8]}/"
    a = LeaderElection(etcd.endpoint, prefix, "a", "127.0.0.1:1", ttl_s=2)
    b = LeaderElection(etcd.endpoint, prefix, "b", "127.0.0.1:2", ttl_s=2)
    ta = asyncio.create_task(a.run())
    await _until(lambda: a.is_leader, 10)
    tb = asyncio.create_task(b.run())
    try:
        await _until(lambda: b.leader_addr == "127.0.0.1:1", 10)
        assert not b.is_leader
        ta.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await ta
        await a.stop()  # a clean stop revokes the lease: b leads within a poll
        await _until(lambda: b.is_leader, 5)
    finally:
        tb.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await tb
        await b.stop()


async def test_a_dead_leader_is_replaced_after_its_lease(etcd: Etcd) -> None:
    prefix = f"/t-{uuid.uuid4().hex[:8]}/"
    a = LeaderElection(etcd.endpoint, prefix, "a", "127.0.0.1:1", ttl_s=2)
    b = LeaderElection(etcd.endpoint, prefix, "b", "127.0.0.1:2", ttl_s=2)
    ta = asyncio.create_task(a.run())
    await _until(lambda: a.is_leader, 10)
    ta.cancel()  # a stops refreshing without resigning, as a killed process would
    with contextlib.suppress(asyncio.CancelledError):
        await ta
    tb = asyncio.create_task(b.run())
    try:
        await _until(lambda: b.is_leader, 10)
    finally:
        tb.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await tb
        await b.stop()
        await a.registry.stop()
