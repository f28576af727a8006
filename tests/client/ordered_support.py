"""What the ordered-consumption tests share: a mesh whose brokers expire locks fast,
the consumer options, creating a topic, waiting, and the per-key order checker."""
from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from ferry.client import ConsumerRecord, Producer, TopicQueue
from ferry.client.core.namesrv import NamesrvClient

from tests.client.conftest import Mesh, start_mesh
from tests.client.util import FAST
from tests.support.procs import Etcd

CHILD = Path(__file__).with_name("ordered_child.py")

LOCK_ENV = {"FERRY_BROKER_LOCK_EXPIRY_MS": "3000", "FERRY_BROKER_CONSUMER_EXPIRY_MS": "6000"}
ORDERED: dict[str, Any] = {**FAST, "ordered": True, "auto_offset_reset": "earliest"}


@pytest.fixture(scope="module")
def lock_mesh(etcd: Etcd, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mesh]:
    m = start_mesh(etcd, tmp_path_factory.mktemp("ordered"), broker_env=LOCK_ENV)
    yield m
    m.stop()


async def make_queues(mesh: Mesh, topic: str) -> list[TopicQueue]:
    """Create `topic` (first send) and return its queues, sorted."""
    async with Producer(namesrv=mesh.namesrv) as producer:
        await producer.send_and_wait(topic, b"warm-up", tags="warm-up")
    namesrv = NamesrvClient(mesh.namesrv)
    await namesrv.start()
    try:
        route = await namesrv.get_route(topic)
    finally:
        await namesrv.close()
    return sorted(TopicQueue(topic, b, q) for b, q in route.readable_queues())


async def until(check: Any, timeout_s: float, what: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not check():
        if loop.time() > deadline:
            raise AssertionError(f"never: {what}")
        await asyncio.sleep(0.05)


class Checker:
    """Every handler call: who ran it on which queue; overlaps of two members on one queue."""

    def __init__(self) -> None:
        self.active: dict[TopicQueue, str] = {}
        self.overlaps: list[tuple[TopicQueue, str, str]] = []
        self.deliveries: list[tuple[str, str, int]] = []   # (member, key, seq), in call order

    def handler(self, member: str) -> Any:
        async def handle(rec: ConsumerRecord) -> None:
            if rec.tags == "warm-up":
                return
            tq = rec.topic_queue
            other = self.active.get(tq)
            if other is not None:
                self.overlaps.append((tq, other, member))
            self.active[tq] = member
            key, seq = rec.body.decode().split(":")
            self.deliveries.append((member, key, int(seq)))
            try:
                await asyncio.sleep(0.003)
            finally:
                if self.active.get(tq) == member:
                    del self.active[tq]
        return handle

    def order_violations(self) -> list[tuple[str, int, int]]:
        """Per key, a first delivery of a seq below one delivered first before it."""
        highest: dict[str, int] = {}
        seen: set[tuple[str, int]] = set()
        bad = []
        for _, key, seq in self.deliveries:
            if (key, seq) in seen:
                continue   # a redelivery (at-least-once), not a first delivery
            seen.add((key, seq))
            if seq < highest.get(key, -1):
                bad.append((key, seq, highest[key]))
            highest[key] = max(seq, highest.get(key, -1))
        return bad


def first_delivery_violations(calls: list[tuple[int, str, int]]) -> list[tuple[str, int, int]]:
    """Over (time_ns, key, seq) handler calls of all members: first deliveries out of order."""
    checker = Checker()
    checker.deliveries = [("", key, seq) for _, key, seq in sorted(calls)]
    return checker.order_violations()
