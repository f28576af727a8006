"""Idempotent consumption: `idempotence.consume` msgs/s with no check, the Redis claim, the SQLite ledger.

One run, one local mesh (etcd, namesrv, one async-flush broker) and one
Redis. N messages (1 KiB, half with a business key) are produced once; then
three fresh consumer groups each consume all N through
`consumer.run(handler, idempotence=...)`:

- `none`: no check, the handler only counts;
- `redis`: `RedisClaim` (scene = the group): a claim before and a confirm after
  each handler, on the local Redis;
- `ledger_sqlite`: `Ledger().transactional(connect=...)` on a SQLite file in the
  bench's temp dir (WAL journal, synchronous=NORMAL): per message one
  transaction with the ledger row and one business row (the handler's
  INSERT), then commit. SQLite has one writer: these run one at a time.

`msgs_s` is N over the time from the first handler call to the N-th one
done, the median of ROUNDS rounds in which the checks take turns; `ratio` is to `none`, with the issue's targets (redis >= 0.3,
ledger >= 0.2). Then, if `bench/celery_tasks.py` exists (the Celery part),
its `main()` prints `celery.tasks_s`. `FERRY_BENCH_IDEMPOTENCE_MESSAGES` sets
N (default 20,000).
"""
from __future__ import annotations

import asyncio
import json
import os
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from contextlib import closing
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ferry import Consumer, ConsumerRecord, Message, Producer  # noqa: E402
from ferry.idempotence import Ledger, RedisClaim, biz_key_of  # noqa: E402

from tests.support.procs import Proc, start_etcd, start_redis  # noqa: E402

MESSAGES = int(os.environ.get("FERRY_BENCH_IDEMPOTENCE_MESSAGES", "20000"))
BODY = os.urandom(1024)
PRODUCE_BATCH = 256
CONCURRENCY = int(os.environ.get("FERRY_BENCH_IDEMPOTENCE_CONCURRENCY", "64"))
TIMEOUT_S = 300.0
TARGETS = {"redis": 0.3, "ledger_sqlite": 0.2}
ROUNDS = 3   # each check runs this many times, alternating; the median is reported


def emit(**fields: object) -> None:
    print(json.dumps(fields), flush=True)


async def _produce(namesrv: str, topic: str, n: int) -> None:
    deadline = time.monotonic() + 30
    async with Producer(namesrv=namesrv) as producer:
        sent = 0
        while sent < n:
            batch = [Message(BODY, key=f"order-{i}" if i % 2 else None)
                     for i in range(sent, min(n, sent + PRODUCE_BATCH))]
            try:
                await producer.send_batch(topic, batch)
            except Exception:
                # The first sends wait until the broker is registered and routed.
                if sent or time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.2)
                continue
            sent += len(batch)


async def _consume(namesrv: str, topic: str, n: int, handler_of: Callable[
        [Callable[[], None]], Callable[..., Awaitable[Any]]], check: object) -> float:
    """Consume `n` records of `topic` in a fresh group through `check`; msgs/s."""
    done = asyncio.Event()
    count = 0
    t0 = 0.0

    def one_done() -> None:
        nonlocal count, t0
        if not t0:
            t0 = time.perf_counter()
        count += 1
        if count >= n:
            done.set()

    group = f"idem-{uuid.uuid4().hex[:8]}"
    async with Consumer(topic, group=group, namesrv=namesrv, auto_offset_reset="earliest",
                        rebalance_interval_ms=500, heartbeat_interval_ms=1000,
                        pull_max_wait_ms=1000, request_timeout_ms=10_000) as consumer:
        running = asyncio.create_task(consumer.run(handler_of(one_done), concurrency=CONCURRENCY,
                                                   idempotence=check))
        await asyncio.wait_for(done.wait(), TIMEOUT_S)
        elapsed = time.perf_counter() - t0
        await consumer.stop()
        await running
    return n / elapsed


def _plain(one_done: Callable[[], None]) -> Callable[..., Awaitable[Any]]:
    async def handle(rec: ConsumerRecord) -> None:
        one_done()
    return handle


def _business_insert(one_done: Callable[[], None]) -> Callable[..., Awaitable[Any]]:
    async def handle(rec: ConsumerRecord, conn: sqlite3.Connection) -> None:
        conn.execute("INSERT INTO orders VALUES (?, ?)", (biz_key_of(rec), rec.msg_id))
        one_done()
    return handle


def _sqlite_connect(path: Path) -> Callable[[], sqlite3.Connection]:
    def connect() -> sqlite3.Connection:
        conn = sqlite3.connect(path, timeout=30)
        conn.execute("PRAGMA journal_mode=WAL")       # one fsync-free append per commit
        conn.execute("PRAGMA synchronous=NORMAL")
        return conn
    return connect


async def _round(namesrv: str, topic: str, n: int, redis_url: str,
                 db_path: Path) -> dict[str, float]:
    """One consumption of all `n` records per check, each in a fresh group and store."""
    with closing(_sqlite_connect(db_path)()) as db, db:
        db.execute("CREATE TABLE orders (order_id TEXT NOT NULL, msg_id TEXT NOT NULL)")
    rates: dict[str, float] = {"none": await _consume(namesrv, topic, n, _plain, None)}
    async with RedisClaim(redis_url, key_prefix=f"bench:{uuid.uuid4().hex[:8]}") as claim:
        rates["redis"] = await _consume(namesrv, topic, n, _plain, claim)
    async with Ledger().transactional(connect=_sqlite_connect(db_path)) as ledger:
        rates["ledger_sqlite"] = await _consume(namesrv, topic, n, _business_insert, ledger)
    return rates


async def measure(namesrv: str, redis_url: str, work: Path, n: int = MESSAGES) -> None:
    """Produce `n` messages, consume them with each check in turn, print the JSON lines.

    The checks take turns over ROUNDS rounds and each reports its median: one
    pass of the no-check case lasts a fraction of a second, too short to
    stand alone on a shared machine.
    """
    topic = f"idem-{uuid.uuid4().hex[:8]}"
    await _produce(namesrv, topic, n)
    runs: dict[str, list[float]] = {}
    for i in range(ROUNDS):
        for check, msgs_s in (await _round(namesrv, topic, n, redis_url,
                                           work / f"ledger-{i}.db")).items():
            runs.setdefault(check, []).append(msgs_s)
    rates = {check: statistics.median(values) for check, values in runs.items()}
    for check, msgs_s in rates.items():
        fields: dict[str, object] = {"bench": "idempotence.consume", "check": check,
                                     "messages": n, "body_bytes": len(BODY),
                                     "concurrency": CONCURRENCY, "rounds": ROUNDS,
                                     "msgs_s": round(msgs_s),
                                     "ratio": round(msgs_s / rates["none"], 3)}
        if check in TARGETS:
            fields["target"] = TARGETS[check]
            fields["meets_target"] = msgs_s / rates["none"] >= TARGETS[check]
        emit(**fields)


def _celery_part() -> None:
    """The Celery figures (`celery.tasks_s`), from bench/celery_tasks.py when it is there."""
    try:
        import celery_tasks  # type: ignore[import-not-found]
    except ModuleNotFoundError as exc:   # not built yet, or Celery not installed
        print(f"bench idempotence: celery.tasks_s skipped ({exc})", file=sys.stderr)
        return
    celery_tasks.main()


def main() -> None:
    from bench_retry import start_mesh  # the same one-broker mesh as the retry bench

    (ROOT / "var").mkdir(exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="idempotence-", dir=ROOT / "var"))
    procs: list[Proc] = []
    try:
        etcd = start_etcd(work / "etcd")
        procs.append(etcd.proc)
        redis = start_redis(work / "redis")
        procs.append(redis.proc)
        mesh_procs, namesrv = start_mesh(work, etcd.endpoint)
        procs.extend(mesh_procs)
        asyncio.run(measure(namesrv, redis.url, work))
    finally:
        for p in reversed(procs):
            p.stop()
        shutil.rmtree(work, ignore_errors=True)
    _celery_part()


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    main()
