"""Consumer retries, nack -> redelivery with 0 back-off: `retry.roundtrip`.

N messages are produced first; then one consumer (group with
`retry_backoff_ms=[0]`) nacks every first delivery, each nack a SEND_BACK
that stores a copy in `%RETRY%<group>` at once, and receives every copy
again through the retry topic. `msgs_s` is N over the time from the first
record received to the last copy received: each message costs one delivery,
one SEND_BACK and one redelivery. Nacks of one `getmany` batch are sent
concurrently (a nack is one request per message: SEND_BACK carries one).

`retry_roundtrip(namesrv, n)` is the measurement alone, for a suite that has
a mesh running already (bench_delay); `main()` starts etcd, namesrv and one
broker itself. `FERRY_BENCH_RETRY_MESSAGES` sets N (default 20,000).
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
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ferry import Consumer, Message, Producer  # noqa: E402

from tests.support.procs import Proc, free_port, spawn, start_etcd, wait_for_port  # noqa: E402

MESSAGES = int(os.environ.get("FERRY_BENCH_RETRY_MESSAGES", "20000"))
BODY = os.urandom(256)
PRODUCE_BATCH = 256
TIMEOUT_S = 300.0
SEGMENT_BYTES = 64 << 20   # preallocated segments: keep the bench's disk use small


def emit(**fields: object) -> None:
    print(json.dumps(fields), flush=True)


async def _produce(namesrv: str, topic: str, n: int) -> None:
    deadline = time.monotonic() + 30
    async with Producer(namesrv=namesrv) as producer:
        while True:   # the first send waits until the broker is registered and routed
            try:
                await producer.send_batch(topic, [Message(BODY)] * min(n, PRODUCE_BATCH))
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.2)
        sent = min(n, PRODUCE_BATCH)
        while sent < n:
            count = min(n - sent, PRODUCE_BATCH)
            await producer.send_batch(topic, [Message(BODY)] * count)
            sent += count


async def retry_roundtrip(namesrv: str, n: int = MESSAGES) -> float:
    """Produce `n` messages, nack each first delivery, receive each again; msgs/s."""
    topic, group = f"retry-{uuid.uuid4().hex[:8]}", f"retry-{uuid.uuid4().hex[:8]}"
    await _produce(namesrv, topic, n)
    first = again = 0
    async with Consumer(topic, group=group, namesrv=namesrv, auto_offset_reset="earliest",
                        retry_backoff_ms=[0], rebalance_interval_ms=500,
                        heartbeat_interval_ms=1000, pull_max_wait_ms=1000,
                        request_timeout_ms=10_000) as consumer:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + TIMEOUT_S
        t0 = 0.0
        while again < n:
            if loop.time() > deadline:
                raise TimeoutError(f"retry.roundtrip: {again} of {n} redelivered in {TIMEOUT_S} s")
            batch = await consumer.getmany(timeout_ms=1000, max_records=1024)
            nacks = []
            for records in batch.values():
                for rec in records:
                    if not t0:
                        t0 = time.perf_counter()
                    if rec.reconsume_times == 0:
                        first += 1
                        nacks.append(consumer.nack(rec))
                    else:
                        again += 1
            if nacks:
                await asyncio.gather(*nacks)
        elapsed = time.perf_counter() - t0
    return n / elapsed


def start_mesh(work: Path, etcd_endpoint: str) -> tuple[list[Proc], str]:
    """One namesrv and one (async-flush) broker over `etcd_endpoint`."""
    ns_port, br_port = free_port(), free_port()
    prefix = f"/bench-retry-{os.getpid()}/"
    py = sys.executable
    namesrv = spawn("namesrv", [py, "-m", "ferry_namesrv"], work / "namesrv", env={
        "FERRY_NAMESRV_PORT": str(ns_port), "FERRY_NAMESRV_ETCD": etcd_endpoint,
        "FERRY_NAMESRV_ETCD_PREFIX": prefix, "FERRY_NAMESRV_LOG_LEVEL": "WARNING",
    })
    broker = spawn("broker", [py, "-m", "ferry_broker"], work / "broker", env={
        "FERRY_BROKER_NAME": "bench-a", "FERRY_BROKER_PORT": str(br_port),
        "FERRY_BROKER_HTTP_PORT": "0", "FERRY_BROKER_DATA_DIR": str(work / "broker" / "data"),
        "FERRY_BROKER_ETCD": etcd_endpoint, "FERRY_BROKER_ETCD_PREFIX": prefix,
        "FERRY_BROKER_FLUSH_MODE": "async", "FERRY_BROKER_LOG_LEVEL": "WARNING",
        "FERRY_BROKER_SEGMENT_BYTES": str(SEGMENT_BYTES),
    })
    wait_for_port("127.0.0.1", ns_port)
    wait_for_port("127.0.0.1", br_port)
    return [broker, namesrv], f"127.0.0.1:{ns_port}"


def main() -> None:
    (ROOT / "var").mkdir(exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="retry-", dir=ROOT / "var"))
    procs: list[Proc] = []
    try:
        etcd = start_etcd(work / "etcd")
        procs.append(etcd.proc)
        mesh_procs, namesrv = start_mesh(work, etcd.endpoint)
        procs.extend(mesh_procs)
        msgs_s = asyncio.run(retry_roundtrip(namesrv, MESSAGES))
        emit(bench="retry.roundtrip", messages=MESSAGES, backoff_ms=0, msgs_s=round(msgs_s))
    finally:
        for p in reversed(procs):
            p.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
