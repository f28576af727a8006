"""Broker-side filtering and ordered consumption: `make bench BENCH=filter`.

N messages (256-byte bodies) are produced once to an 8-queue topic: one in
ten has tag `match` and properties `amount=150, region=eu`, the rest tag
`other` and `amount=50, region=asia`. Then, each with a fresh group from the
earliest offset and one Consumer:
- `filter.plain`: every message consumed (the baseline of this run);
- `filter.tag`: `subscription="match"`;
- `filter.sql`: `subscription=Sql("amount > 100 AND region IN ('eu', 'us')")`.
A filtered case ends when it has received the N/10 matching messages;
`delivered_msgs_s` is those over its time, `scanned_msgs_s` all N over the
same time (the broker looked at every one), `ratio_scanned_to_plain` the
latter over the plain case's msgs/s (target >= 0.5).
- `order.consume`: `consumer.run(handler, ordered=True)` over the 8 queues,
  against `order.unordered`, `run(handler, concurrency=8)`, on the same
  messages; `ratio` is ordered over unordered (target >= 0.5). The handler
  does nothing but count.
`FERRY_BENCH_FILTER_MESSAGES` sets N (default 200,000).
"""
from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_retry import start_mesh  # noqa: E402
from ferry import Consumer, Message, Producer, Sql  # noqa: E402
from ferry.client.core.message import ConsumerRecord  # noqa: E402

from tests.support.procs import Proc, start_etcd  # noqa: E402

MESSAGES = int(os.environ.get("FERRY_BENCH_FILTER_MESSAGES", "200000")) // 10 * 10
BODY = os.urandom(256)
PRODUCE_BATCH = 250
TIMEOUT_S = 600.0
SQL = "amount > 100 AND region IN ('eu', 'us')"
MATCH = Message(BODY, tags="match", properties={"amount": "150", "region": "eu"})
OTHER = Message(BODY, tags="other", properties={"amount": "50", "region": "asia"})


def emit(**fields: object) -> None:
    print(json.dumps(fields), flush=True)


async def produce(namesrv: str, topic: str, n: int) -> None:
    """n messages, every tenth a match, in batches of PRODUCE_BATCH."""
    batch = [MATCH if i % 10 == 0 else OTHER for i in range(PRODUCE_BATCH)]
    deadline = time.monotonic() + 30
    async with Producer(namesrv=namesrv) as producer:
        sent = 0
        while sent < n:
            count = min(n - sent, PRODUCE_BATCH)
            try:
                await producer.send_batch(topic, batch[:count])
            except Exception:
                if sent or time.monotonic() > deadline:  # only the first waits for the route
                    raise
                await asyncio.sleep(0.2)
                continue
            sent += count


async def consume(namesrv: str, topic: str, want: int, subscription: object = None) -> float:
    """Seconds from start until a fresh group from earliest received `want` messages.

    The clock includes the consumer's start: its fetchers begin pulling (and
    the broker scanning) inside `start()`, and with few matching messages most
    of the work would otherwise fall before the clock started.
    """
    t0 = time.perf_counter()
    async with Consumer(topic, group=f"bench-{uuid.uuid4().hex[:8]}", namesrv=namesrv,
                        auto_offset_reset="earliest", subscription=subscription) as consumer:
        got = 0
        async with asyncio.timeout(TIMEOUT_S):
            while got < want:
                batch = await consumer.getmany(timeout_ms=1000, max_records=1024)
                got += sum(len(v) for v in batch.values())
        return time.perf_counter() - t0


async def run_handler(namesrv: str, topic: str, want: int, **run_options: object) -> float:
    """Seconds until `consumer.run(handler, **run_options)` handled `want` messages."""
    got = 0
    done = asyncio.Event()

    async def handler(record: ConsumerRecord) -> None:
        nonlocal got
        got += 1
        if got >= want:
            done.set()

    t0 = time.perf_counter()
    async with Consumer(topic, group=f"bench-{uuid.uuid4().hex[:8]}", namesrv=namesrv,
                        auto_offset_reset="earliest") as consumer:
        runner = asyncio.ensure_future(consumer.run(handler, **run_options))
        try:
            async with asyncio.timeout(TIMEOUT_S):
                await done.wait()
            return time.perf_counter() - t0
        finally:
            runner.cancel()
            await asyncio.gather(runner, return_exceptions=True)


async def measure(namesrv: str) -> None:
    topic = "bench-filter"
    n, matching = MESSAGES, MESSAGES // 10
    await produce(namesrv, topic, n)
    plain_s = await consume(namesrv, topic, n)
    plain = n / plain_s
    emit(bench="filter.plain", messages=n, msgs_s=round(plain))
    for case, sub in (("filter.tag", "match"), ("filter.sql", Sql(SQL))):
        secs = await consume(namesrv, topic, matching, sub)
        emit(bench=case, messages=n, matching=matching, delivered_msgs_s=round(matching / secs),
             scanned_msgs_s=round(n / secs), plain_msgs_s=round(plain),
             ratio_scanned_to_plain=round(n / secs / plain, 2))
    await _ordered(namesrv, topic, n, run_handler)


async def _ordered(namesrv: str, topic: str, n: int,
                   run: Callable[..., Awaitable[float]]) -> None:
    unordered = n / await run(namesrv, topic, n, concurrency=8)
    emit(bench="order.unordered", messages=n, queues=8, msgs_s=round(unordered))
    ordered = n / await run(namesrv, topic, n, ordered=True, concurrency=8)
    emit(bench="order.consume", messages=n, queues=8, msgs_s=round(ordered),
         unordered_msgs_s=round(unordered), ratio=round(ordered / unordered, 2))


def main() -> None:
    (ROOT / "var").mkdir(exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="filter-", dir=ROOT / "var"))
    procs: list[Proc] = []
    try:
        etcd = start_etcd(work / "etcd")
        procs.append(etcd.proc)
        mesh_procs, namesrv = start_mesh(work, etcd.endpoint)
        procs.extend(mesh_procs)
        asyncio.run(measure(namesrv))
    finally:
        for p in reversed(procs):
            p.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
