"""Ordered consumption through membership changes, a kill -9 and a broker restart.

Three ordered members (child processes) consume one topic of 8 queues on two
brokers while a producer sends 50 keys in rounds (round r of every key is
acknowledged before round r + 1 is sent, so each key's send order is its
sequence; the topic lists its brokers, so a key keeps its queue while its
broker is down: see ferry.routing.cache). Meanwhile a member joins, one leaves cleanly, one is killed with
SIGKILL and broker-a is restarted. A checker then reads the whole delivery
history (one shared append-only file, so its line order is the order of the
deliveries) and counts, per key, every first delivery that comes after the
first delivery of a later message of that key: there must be none, and
every acknowledged message must have been delivered.
"""
from __future__ import annotations

import asyncio
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest
from ferry import Admin, Producer
from ferry.errors import FerryError

from tests.client.conftest import FAST_EXPIRY_ENV, Mesh, start_mesh, unique
from tests.support.procs import Etcd, Proc, spawn

pytestmark = [pytest.mark.integration, pytest.mark.slow]

CHILD = Path(__file__).with_name("ordered_chaos_child.py")
KEYS = 50
ROUNDS = 60
ROUND_PAUSE_S = 0.25
DRAIN_TIMEOUT_S = 120.0
LOCK_ENV = {**FAST_EXPIRY_ENV, "FERRY_BROKER_LOCK_EXPIRY_MS": "4000"}


def order_violations(lines: list[str]) -> tuple[int, dict[str, set[int]]]:
    """(first deliveries out of send order, delivered sequence numbers per key)."""
    seen: dict[str, set[int]] = defaultdict(set)
    last_first: dict[str, int] = {}
    violations = 0
    for line in lines:
        parts = line.split()
        if len(parts) != 2:
            continue
        key, seq_text = parts[1].rsplit(":", 1)
        seq = int(seq_text)
        if seq in seen[key]:
            continue   # a redelivery: order is about first deliveries
        seen[key].add(seq)
        if seq < last_first.get(key, -1):
            violations += 1
        last_first[key] = max(seq, last_first.get(key, -1))
    return violations, seen


def test_checker_counts_violations() -> None:
    lines = ["m k:0", "m k:2", "m k:1", "m k:2", "m j:0", "m j:1"]
    violations, seen = order_violations(lines)
    assert violations == 1
    assert seen == {"k": {0, 1, 2}, "j": {0, 1}}


@pytest.fixture
def lock_mesh(etcd: Etcd, tmp_path: Path):
    m = start_mesh(etcd, tmp_path / "mesh", broker_env=LOCK_ENV)
    yield m
    m.stop()


def _member(mesh: Mesh, topic: str, group: str, out: Path, work: Path, name: str) -> Proc:
    return spawn(name, [sys.executable, str(CHILD), mesh.namesrv, topic, group, str(out)],
                 work / name)


async def _send_rounds(mesh: Mesh, topic: str, acked: dict[str, set[int]],
                       chaos: asyncio.Event) -> None:
    async with Producer(namesrv=mesh.namesrv, request_timeout_ms=5_000) as producer:
        for r in range(ROUNDS):
            async def one(key: str, r: int = r) -> None:
                try:
                    await producer.send_and_wait(topic, f"{key}:{r}".encode(), key=key,
                                                 ordered=True)
                    acked[key].add(r)
                except FerryError:
                    pass   # not acknowledged (broker down): not expected, may still arrive
            await asyncio.gather(*(one(f"key{k}") for k in range(KEYS)))
            if r == ROUNDS // 3:
                chaos.set()
            await asyncio.sleep(ROUND_PAUSE_S)


async def test_ordered_members_join_leave_die_and_a_broker_restarts(
        lock_mesh: Mesh, tmp_path: Path) -> None:
    mesh = lock_mesh
    topic, group = unique("ordered"), unique("og")
    out = tmp_path / "deliveries.txt"
    out.touch()
    # Listed brokers stay in the route while down: keys keep their queue through the restart.
    async with Admin(namesrv=mesh.namesrv) as admin:
        await admin.create_topic(topic, queues=4, brokers=["broker-a", "broker-b"])
    members = [_member(mesh, topic, group, out, tmp_path, f"m{i}") for i in range(2)]
    acked: dict[str, set[int]] = defaultdict(set)
    chaos = asyncio.Event()
    sender = asyncio.ensure_future(_send_rounds(mesh, topic, acked, chaos))
    try:
        await asyncio.sleep(3)
        members.append(_member(mesh, topic, group, out, tmp_path, "m2"))    # one joins
        await chaos.wait()
        await asyncio.to_thread(members[0].stop)                            # one leaves
        await asyncio.sleep(2)
        await asyncio.to_thread(members[1].kill9)                           # one dies
        members.append(_member(mesh, topic, group, out, tmp_path, "m3"))
        await asyncio.sleep(2)
        await asyncio.to_thread(mesh.brokers["broker-a"].proc.stop)         # a broker restarts
        await asyncio.to_thread(mesh.start_broker, "broker-a")
        await sender
        deadline = time.monotonic() + DRAIN_TIMEOUT_S
        while time.monotonic() < deadline:
            _, seen = order_violations(out.read_text().splitlines())
            if all(acked[k] <= seen[k] for k in acked):
                break
            await asyncio.sleep(1)
    finally:
        sender.cancel()
        await asyncio.gather(sender, return_exceptions=True)
        for m in members:
            m.stop()
    violations, seen = order_violations(out.read_text().splitlines())
    missing = {k: sorted(acked[k] - seen[k]) for k in acked if acked[k] - seen[k]}
    assert sum(len(v) for v in acked.values()) > KEYS * ROUNDS // 2
    assert not missing, f"acknowledged but never delivered: {missing}"
    assert violations == 0
