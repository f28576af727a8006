"""The mesh bench's workload, shared by both sides (Ferry and Redis Streams) and by
bench_put: message size and counts, the client loop, the JSON-lines output, and the paced
latency run (a fixed rate, latency from the intended send time, a steady GC)."""
from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import os
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from typing import Any

BODY = os.urandom(1024)
BATCH = 256
# a whole number of batches, so both sides produce exactly TOTAL
# (600,064: at 200,192 a consume pass lasted ~0.4 s, and fixed costs such as the
# clients' start and the span exporter's first connection weighed ~10 % in it.)
TOTAL = int(os.environ.get("FERRY_BENCH_MESH_MESSAGES", "600064")) // BATCH * BATCH
LATENCY_RATE = 2000
LATENCY_SECONDS = float(os.environ.get("FERRY_BENCH_MESH_LATENCY_S", "10"))
WARMUP_SENDS = 16  # two rounds over the topic's 8 queues
SYNC_SENDERS = 64
SEND_WINDOW = 20_000        # produce_send: result futures in flight at most
REDIS_SEND_PIPELINE = 1000  # produce_send's Redis side: XADDs per pipeline
BURST = 20_000              # produce_burst: sends in a row before gathering their futures
CONSUME_MAX_RECORDS = 2000  # the mesh of `make up`: getmany(max_records=) and XREADGROUP COUNT
SYNC_SECONDS = 5.0


# The produce passes' client loop (see the module docstring).
CLIENT_LOOP = os.environ.get("FERRY_BENCH_CLIENT_LOOP", "asyncio")
if CLIENT_LOOP not in ("asyncio", "uvloop"):
    raise SystemExit(f"FERRY_BENCH_CLIENT_LOOP must be asyncio or uvloop, not {CLIENT_LOOP!r}")
run_client: Callable[[Coroutine[Any, Any, float]], float] = asyncio.run
if CLIENT_LOOP == "uvloop":
    import uvloop
    run_client = uvloop.run


def emit(**fields: object) -> None:
    """One JSON line; it says which code ran (`twins`: the compiled twins or the pure
    modules, `FERRY_NO_EXTENSIONS=1`; the services the bench starts inherit the setting)."""
    from ferry import extensions
    fields.setdefault("twins", "compiled" if extensions.compiled() else "pure")
    print(json.dumps(fields), flush=True)


def percentiles(samples: list[float]) -> dict[str, float]:
    s = sorted(samples)

    def at(q: float) -> float:
        return round(s[min(len(s) - 1, int(q * len(s)))], 3) if s else float("nan")

    return {"p50_ms": at(0.50), "p99_ms": at(0.99), "p999_ms": at(0.999)}


async def paced(rate: int, seconds: float, send: Callable[[int, float], Awaitable[None]]) -> int:
    """Call send(i, intended_time) at a fixed rate; latency counts from the intended time,
    so a stalled sender is charged for the messages it delayed (no coordinated omission)."""
    n = int(rate * seconds)
    start = time.time() + 0.2
    for i in range(n):
        intended = start + i / rate
        delay = intended - time.time()
        if delay > 0:
            await asyncio.sleep(delay)
        await send(i, intended)
    return n


@contextlib.contextmanager
def steady_gc() -> Iterator[None]:
    """What a latency-sensitive service does once it has started: collect, then freeze what
    exists (modules, clients, connections), so that a full collection during the paced run
    scans only what the run itself allocated. Used alike for Ferry and Redis."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
