"""The load of the failover tests: keyed sends with sequence numbers, a group reading along.

`KeyedLoad` runs one sender per key (ordered sends: a key keeps its queue and
its order) and records every acknowledged (key, seq) with the time of its ack;
`Reader` is a consumer group member that records every delivery. `verdict()`
compares them: acknowledged messages never delivered (lost), duplicates, and
keys whose first deliveries are out of sequence order.
"""
from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field

from ferry import Consumer, Producer
from ferry.errors import FerryError

#: Producer settings that ride out a failover of a few seconds (retries * backoff > lease).
FAILOVER_PRODUCER = {"retries": 400, "retry_backoff_ms": 50, "request_timeout_ms": 3_000,
                     "linger_ms": 1}
FAST_CONSUMER = {"heartbeat_interval_ms": 500, "rebalance_interval_ms": 500,
                 "auto_commit_interval_ms": 500, "pull_max_wait_ms": 1_000,
                 "request_timeout_ms": 3_000, "auto_offset_reset": "earliest"}


def body(key: str, seq: int) -> bytes:
    return f"{key}:{seq}".encode()


def parse(raw: bytes) -> tuple[str, int]:
    key, _, seq = raw.decode().partition(":")
    return key, int(seq)


@dataclass
class KeyedLoad:
    """Ordered sends of `keys` keys, each numbering its messages 0, 1, 2, ..."""

    namesrv: str
    topic: str
    keys: int = 8
    acked: dict[tuple[str, int], float] = field(default_factory=dict)   # -> monotonic ack time
    failed: int = 0
    _stop: asyncio.Event = field(default_factory=asyncio.Event)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)
    _producer: Producer | None = None

    async def start(self) -> None:
        self._producer = Producer(namesrv=self.namesrv, **FAILOVER_PRODUCER)  # type: ignore[arg-type]
        await self._producer.start()
        self._tasks = [asyncio.create_task(self._send(f"k{i}")) for i in range(self.keys)]

    async def _send(self, key: str) -> None:
        assert self._producer is not None
        seq = 0
        while not self._stop.is_set():
            try:
                await self._producer.send_and_wait(self.topic, body(key, seq), key=key,
                                                   ordered=True)
            except FerryError:
                self.failed += 1   # retries spent: not acknowledged; the next seq goes on
            else:
                self.acked[(key, seq)] = time.monotonic()
            seq += 1

    async def stop(self) -> None:
        self._stop.set()
        await asyncio.gather(*self._tasks)
        if self._producer is not None:
            await self._producer.stop()


@dataclass
class Reader:
    """One member of `group` reading `topic` from the start, recording every delivery."""

    namesrv: str
    topic: str
    group: str
    delivered: list[tuple[str, int]] = field(default_factory=list)
    consumer: Consumer | None = None
    _task: asyncio.Task[None] | None = None

    async def start(self, **kw: object) -> None:
        self.consumer = Consumer(self.topic, group=self.group, namesrv=self.namesrv,
                                 **{**FAST_CONSUMER, **kw})  # type: ignore[arg-type]
        await self.consumer.start()
        self._task = asyncio.create_task(self._read())

    async def _read(self) -> None:
        assert self.consumer is not None
        while True:
            batch = await self.consumer.getmany(timeout_ms=200)
            for records in batch.values():
                self.delivered += [parse(r.body) for r in records]

    async def wait_for(self, wanted: set[tuple[str, int]], timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if wanted <= set(self.delivered):
                return True
            await asyncio.sleep(0.1)
        return False

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self.consumer is not None:
            await self.consumer.stop()


@dataclass
class Verdict:
    acked: int
    delivered: int
    lost: list[tuple[str, int]]
    duplicates: int
    out_of_order_keys: list[str]


def verdict(acked: set[tuple[str, int]], delivered: list[tuple[str, int]]) -> Verdict:
    """Lost acknowledged messages, duplicates, and keys whose first deliveries go backwards."""
    seen: set[tuple[str, int]] = set()
    last: dict[str, int] = {}
    bad: set[str] = set()
    for key, seq in delivered:
        if (key, seq) in seen:
            continue
        seen.add((key, seq))
        if seq < last.get(key, -1):
            bad.add(key)
        last[key] = max(seq, last.get(key, -1))
    return Verdict(acked=len(acked), delivered=len(delivered), lost=sorted(acked - seen),
                   duplicates=len(delivered) - len(seen), out_of_order_keys=sorted(bad))
