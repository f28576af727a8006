"""Spark's batch read of a topic beside a plain Ferry Consumer: `make bench BENCH=spark`.

One run, one machine: etcd, a namesrv and a broker (real processes, tracing
off), one topic of 8 queues filled with 1,000,000 messages of 256 bytes by one
producer. Then the same topic is read whole FERRY_BENCH_SPARK_READS times (5)
each way, taking turns: by a `ferry.Consumer` (getmany, one process, a fresh
group from the earliest offset each time) and by `spark.read.format("ferry")`
on `local[2]` (one partition per queue, every row materialized by the `noop`
sink, so no column is pruned away). Spark's session is started and warmed
before the clock starts by a read of a smaller topic (FERRY_BENCH_SPARK_WARMUP
messages, 100,000). Each side's figure is the median of its reads: a
long-lived session reads at the JVM's steady state, which its first large
reads approach as the JIT compiles Spark's per-row path (measured: a first
timed read after the warm-up about a quarter slower than the next ones), and
the Consumer's reads vary with the machine (on the shared 2-core machine single
reads of either side swung by a fifth within one run, and the ratio of medians
of 3 by 0.94-1.18 between runs of the same code: 5 reads each). Prints one JSON
line per case and the ratio Spark / Consumer.
"""
from __future__ import annotations

import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "spark"))

from ferry import Admin, Consumer, Message, Producer  # noqa: E402

from tests.support.procs import Proc, free_port, spawn, start_etcd, wait_for_port  # noqa: E402

BATCH = 256
TOTAL = int(os.environ.get("FERRY_BENCH_SPARK_MESSAGES", "1000000"))
BODY = os.urandom(256)
QUEUES = 8
WARMUP_MESSAGES = int(os.environ.get("FERRY_BENCH_SPARK_WARMUP", "100000"))
READS = max(1, int(os.environ.get("FERRY_BENCH_SPARK_READS", "5")))
MASTER = os.environ.get("FERRY_SPARK_MASTER", "local[2]")
# 1M × ~330 bytes stored: 256 MiB segments keep the preallocated store small.
SEGMENT_BYTES = 256 << 20


def emit(**fields: object) -> None:
    print(json.dumps(fields), flush=True)


def start_ferry(work: Path, etcd_endpoint: str) -> tuple[list[Proc], str]:
    ns_port, br_port = free_port(), free_port()
    prefix = f"/bench-spark-{os.getpid()}/"
    env = {"FERRY_TRACING": "off"}
    py = sys.executable
    namesrv = spawn("namesrv", [py, "-m", "ferry_namesrv"], work / "namesrv", env={
        **env, "FERRY_NAMESRV_PORT": str(ns_port), "FERRY_NAMESRV_ETCD": etcd_endpoint,
        "FERRY_NAMESRV_ETCD_PREFIX": prefix, "FERRY_NAMESRV_LOG_LEVEL": "WARNING"})
    broker = spawn("broker", [py, "-m", "ferry_broker"], work / "broker", env={
        **env, "FERRY_BROKER_NAME": "bench-a", "FERRY_BROKER_PORT": str(br_port),
        "FERRY_BROKER_HTTP_PORT": "0", "FERRY_BROKER_DATA_DIR": str(work / "broker" / "data"),
        "FERRY_BROKER_ETCD": etcd_endpoint, "FERRY_BROKER_ETCD_PREFIX": prefix,
        "FERRY_BROKER_SEGMENT_BYTES": str(SEGMENT_BYTES), "FERRY_BROKER_LOG_LEVEL": "WARNING"})
    wait_for_port("127.0.0.1", ns_port)
    wait_for_port("127.0.0.1", br_port)
    return [broker, namesrv], f"127.0.0.1:{ns_port}"


async def fill(namesrv: str, topic: str, n: int) -> None:
    """Create `topic` (once the broker is registered) and send `n` messages to it."""
    deadline = time.monotonic() + 30
    async with Admin(namesrv=namesrv) as admin:
        created = False
        while True:   # until the broker has registered and serves every queue of the topic
            try:
                if not created:
                    await admin.create_topic(topic, queues=QUEUES)
                    created = True
                if len(await admin.queue_infos(topic)) == QUEUES:
                    break
            except Exception:
                if time.monotonic() > deadline:
                    raise
            await asyncio.sleep(0.3)
    async with Producer(namesrv=namesrv) as producer:
        batch = [Message(BODY) for _ in range(BATCH)]
        in_flight: set[asyncio.Future[object]] = set()
        sizes = [BATCH] * (n // BATCH) + ([n % BATCH] if n % BATCH else [])   # exactly n
        for size in sizes:
            fut = asyncio.ensure_future(producer.send_batch(topic, batch[:size]))
            in_flight.add(fut)
            fut.add_done_callback(in_flight.discard)
            if len(in_flight) >= 16:
                await asyncio.wait(in_flight, return_when=asyncio.FIRST_COMPLETED)
        await asyncio.gather(*in_flight)


async def consumer_read(namesrv: str, topic: str, n: int, group: str = "bench-spark") -> float:
    """Seconds for a fresh group to read `n` messages of `topic` from the earliest offset."""
    async with Consumer(topic, group=group, namesrv=namesrv,
                        auto_offset_reset="earliest", enable_auto_commit=False) as consumer:
        got = 0
        t0 = time.perf_counter()
        while got < n:
            batch = await consumer.getmany(timeout_ms=1000, max_records=BATCH * 4)
            got += sum(len(v) for v in batch.values())
        return time.perf_counter() - t0


def spark_read(spark: object, namesrv: str, topic: str) -> tuple[float, int]:
    """Seconds for `spark.read` to materialize every row of `topic` (the noop sink), and
    the read's partitions (counted after the clock stops)."""
    df = spark.read.format("ferry").option("namesrv", f"http://{namesrv}") \
        .option("topic", topic).load()  # type: ignore[attr-defined]
    t0 = time.perf_counter()
    df.write.format("noop").mode("overwrite").save()
    seconds = time.perf_counter() - t0
    return seconds, df.rdd.getNumPartitions()


def main() -> None:
    (ROOT / "var").mkdir(exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="spark-", dir=ROOT / "var"))
    procs: list[Proc] = []
    spark = None
    try:
        etcd = start_etcd(work / "etcd")
        procs.append(etcd.proc)
        ferry_procs, namesrv = start_ferry(work, etcd.endpoint)
        procs.extend(ferry_procs)
        t0 = time.perf_counter()
        asyncio.run(fill(namesrv, "bench-spark", TOTAL))
        produce_s = time.perf_counter() - t0
        asyncio.run(fill(namesrv, "bench-spark-warm", WARMUP_MESSAGES))
        from ferry_spark import session
        spark = session("ferry-bench", MASTER, **{"spark.ui.enabled": "false",
                                                  "spark.ui.showConsoleProgress": "false"})
        spark.sparkContext.setLogLevel("ERROR")
        spark_read(spark, namesrv, "bench-spark-warm")   # JVM, workers and imports warm
        consumer_runs: list[float] = []
        spark_runs: list[float] = []
        for i in range(READS):   # taking turns, so both sides see the same machine
            consumer_runs.append(asyncio.run(consumer_read(namesrv, "bench-spark", TOTAL,
                                                           f"bench-spark-{i}")))
            seconds, partitions = spark_read(spark, namesrv, "bench-spark")
            spark_runs.append(seconds)
        consumer_s, spark_s = statistics.median(consumer_runs), statistics.median(spark_runs)
        emit(bench="spark.produce", messages=TOTAL, body_bytes=len(BODY),
             msgs_s=round(TOTAL / produce_s))
        emit(bench="spark.consumer_read", messages=TOTAL, msgs_s=round(TOTAL / consumer_s))
        emit(bench="spark.read", messages=TOTAL, master=MASTER, queues=QUEUES,
             partitions=partitions, warmup_messages=WARMUP_MESSAGES, reads=READS,
             rows_s=round(TOTAL / spark_s), consumer_msgs_s=round(TOTAL / consumer_s),
             rows_s_each=[round(TOTAL / t) for t in spark_runs],
             consumer_msgs_s_each=[round(TOTAL / t) for t in consumer_runs],
             ratio=round(consumer_s / spark_s, 3))
    finally:
        if spark is not None:
            spark.stop()
        for p in reversed(procs):
            p.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
