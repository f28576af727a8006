"""Helpers for the client integration tests: short client intervals and collecting records."""
from __future__ import annotations

import asyncio
from typing import Any

from ferry.client import Consumer, ConsumerRecord, Producer, TopicQueue
from ferry.errors import FerryError

# Short intervals so that rebalances take a second, not 5 s (defaults stay as documented).
FAST: dict[str, Any] = {"heartbeat_interval_ms": 300, "rebalance_interval_ms": 300,
                        "pull_max_wait_ms": 1000, "request_timeout_ms": 5000,
                        "auto_commit_interval_ms": 300}


async def collect(consumers: list[Consumer], n: int, timeout_s: float = 30.0,
                  settle_s: float = 0.0) -> dict[int, list[ConsumerRecord]]:
    """Records per consumer index until `n` arrived in total (then `settle_s` more)."""
    got: dict[int, list[ConsumerRecord]] = {i: [] for i in range(len(consumers))}
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    settle_until: float | None = None
    while loop.time() < deadline:
        for i, c in enumerate(consumers):
            batch = await c.getmany(timeout_ms=20)
            for records in batch.values():
                got[i].extend(records)
        total = sum(len(v) for v in got.values())
        if total >= n:
            if settle_until is None:
                settle_until = loop.time() + settle_s
            if loop.time() >= settle_until:
                break
    return got


async def wait_assignment(consumers: list[Consumer], queues: set[TopicQueue],
                          timeout_s: float = 20.0) -> None:
    """Until the members' assignments are disjoint and cover exactly `queues`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        shares = [c.assignment() for c in consumers]
        union = set().union(*shares)
        if union == queues and sum(len(s) for s in shares) == len(queues):
            return
        if loop.time() > deadline:
            raise AssertionError(f"assignment never settled: {shares}")
        await asyncio.sleep(0.1)


async def send_all(namesrv: str, topic: str, bodies: list[bytes]) -> None:
    """Send each body once acknowledged (a broker just restarted may refuse a while)."""
    async with Producer(namesrv=namesrv, request_timeout_ms=3000,
                        broker_backoff_ms=500) as producer:
        for body in bodies:
            for _ in range(100):
                try:
                    await producer.send_and_wait(topic, body)
                    break
                except FerryError:
                    await asyncio.sleep(0.2)
            else:
                raise AssertionError(f"could not send {body!r}")
