"""The Ferry client side of `make bench BENCH=mesh`: the produce and consume passes as a
user writes them (bench_mesh and mesh_up run them against their meshes; mesh_redis has
the Redis Streams side).

- `ferry_produce`: `send_batch` of BATCH messages, up to 16 batches in flight;
- `ferry_produce_send`: `await producer.send()` per message, at most SEND_WINDOW result
  futures in flight (the oldest awaited once the window is full): a sliding window;
- `ferry_produce_burst`: BURST `await producer.send()` in a row, then `asyncio.gather`
  of their futures, repeated: what the aiokafka docs show for many messages;
- `ferry_consume`: a fresh group from the earliest offset, `getmany(max_records=...)` in
  a loop; `ferry_consume_iter`: the same through `async for`.

Each returns messages per second; the clock of a consume pass starts once the consumer
has joined and taken its queues (as Redis's starts after XGROUP CREATE).
"""
from __future__ import annotations

import asyncio
import collections
import time

from ferry import Consumer, Message, Producer
from ferry.auth.credentials import Credentials
from mesh_workload import BATCH, BODY, BURST, SEND_WINDOW


async def ferry_produce(namesrv: str, topic: str, n: int,
                        credentials: Credentials | None = None) -> float:
    async with Producer(namesrv=namesrv, credentials=credentials) as producer:
        batch = [Message(BODY) for _ in range(BATCH)]
        in_flight: set[asyncio.Future[object]] = set()
        t0 = time.perf_counter()
        for _ in range(n // BATCH):
            fut = asyncio.ensure_future(producer.send_batch(topic, batch))
            in_flight.add(fut)
            fut.add_done_callback(in_flight.discard)
            if len(in_flight) >= 16:
                await asyncio.wait(in_flight, return_when=asyncio.FIRST_COMPLETED)
        await asyncio.gather(*in_flight)
        return n / (time.perf_counter() - t0)


async def ferry_produce_send(namesrv: str, topic: str, n: int,
                             credentials: Credentials | None = None) -> float:
    """One `await producer.send()` per message, at most SEND_WINDOW futures in flight."""
    async with Producer(namesrv=namesrv, credentials=credentials) as producer:
        in_flight: collections.deque[asyncio.Future[object]] = collections.deque()
        send = producer.send
        t0 = time.perf_counter()
        for _ in range(n):
            in_flight.append(await send(topic, BODY))
            if len(in_flight) >= SEND_WINDOW:
                await in_flight.popleft()
        for fut in in_flight:
            await fut
        return n / (time.perf_counter() - t0)


async def ferry_produce_burst(namesrv: str, topic: str, n: int,
                              credentials: Credentials | None = None) -> float:
    """n // BURST bursts: BURST `await producer.send()`, then gather their futures."""
    async with Producer(namesrv=namesrv, credentials=credentials) as producer:
        send = producer.send
        bursts = n // BURST
        t0 = time.perf_counter()
        for _ in range(bursts):
            futures = [await send(topic, BODY) for _ in range(BURST)]
            await asyncio.gather(*futures)
        return bursts * BURST / (time.perf_counter() - t0)


async def ferry_consume(namesrv: str, topic: str, n: int, group: str = "bench",
                        max_records: int = BATCH * 4) -> float:
    async with Consumer(topic, group=group, namesrv=namesrv,
                        auto_offset_reset="earliest", enable_auto_commit=True) as consumer:
        got = 0
        t0 = time.perf_counter()
        while got < n:
            batch = await consumer.getmany(timeout_ms=1000, max_records=max_records)
            got += sum(len(v) for v in batch.values())
        return got / (time.perf_counter() - t0)


async def ferry_consume_iter(namesrv: str, topic: str, n: int, group: str) -> float:
    """`async for record in consumer`, a fresh group from the earliest offset."""
    async with Consumer(topic, group=group, namesrv=namesrv,
                        auto_offset_reset="earliest", enable_auto_commit=True) as consumer:
        got = 0
        t0 = time.perf_counter()
        async for _record in consumer:
            got += 1
            if got >= n:
                break
        return got / (time.perf_counter() - t0)
