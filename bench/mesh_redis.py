"""The Redis Streams side of `make bench BENCH=mesh`: the same work as Ferry's, with
redis-py pipelining XADD and XREADGROUP + XACK (see bench_mesh's docstring)."""
from __future__ import annotations

import asyncio
import time

import redis
import redis.asyncio as aredis
from mesh_workload import (
    BATCH,
    BODY,
    LATENCY_RATE,
    LATENCY_SECONDS,
    paced,
    percentiles,
    steady_gc,
)


def redis_produce(client: redis.Redis, stream: str, n: int, batch: int = BATCH) -> float:
    t0 = time.perf_counter()
    for _ in range(n // batch):
        pipe = client.pipeline(transaction=False)
        for _ in range(batch):
            pipe.xadd(stream, {"b": BODY})
        pipe.execute()
    return n / (time.perf_counter() - t0)


def redis_consume(client: redis.Redis, stream: str, n: int, group: str = "bench",
                  count: int = BATCH * 4, each: bool = False) -> float:
    """A fresh group from the start: XREADGROUP COUNT `count` + XACK in a loop. `each`: the
    records are also taken one by one, with their body (Ferry's `async for` counterpart)."""
    client.xgroup_create(stream, group, id="0")
    got = 0
    t0 = time.perf_counter()
    while got < n:
        resp = client.xreadgroup(group, "c1", {stream: ">"}, count=count, block=1000)
        if not resp:
            continue
        if each:
            ids = []
            for mid, fields in resp[0][1]:
                _ = fields[b"b"]   # what a handler reads
                ids.append(mid)
        else:
            ids = [mid for mid, _ in resp[0][1]]
        pipe = client.pipeline(transaction=False)
        pipe.xack(stream, group, *ids)
        pipe.execute()
        got += len(ids)
    return got / (time.perf_counter() - t0)


async def redis_latency(url: str, stream: str) -> dict[str, float]:
    client = aredis.from_url(url)
    reader = aredis.from_url(url)
    await client.xgroup_create(stream, "lat", id="$", mkstream=True)
    latencies: list[float] = []
    n_expected = int(LATENCY_RATE * LATENCY_SECONDS)

    async def consume() -> None:
        while len(latencies) < n_expected:
            resp = await reader.xreadgroup("lat", "c1", {stream: ">"}, count=1000, block=1000)
            now = time.time()
            if not resp:
                continue
            ids = []
            for mid, fields in resp[0][1]:
                latencies.append((now - float(fields[b"t"])) * 1000)
                ids.append(mid)
            await reader.xack(stream, "lat", *ids)

    async def send(i: int, intended: float) -> None:
        await client.xadd(stream, {"b": BODY, "t": repr(intended)})

    with steady_gc():
        task = asyncio.create_task(consume())
        await paced(LATENCY_RATE, LATENCY_SECONDS, send)
        await asyncio.wait_for(task, timeout=30)
    await client.aclose()
    await reader.aclose()
    return percentiles(latencies)
