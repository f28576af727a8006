"""Celery task throughput on Ferry beside Celery on Redis, in one run: `celery.tasks_s`.

The same N trivial tasks (`FERRY_BENCH_CELERY_TASKS`, default 2,000) go
through one Celery worker (`--pool=prefork -c 2`, `acks_late`, prefetch
multiplier 8) twice: once with `broker="ferry://<namesrv>"` (etcd, namesrv and
one async-flush broker started here) and once with `broker="redis://..."` (a
real redis-server on a free port). Tasks are published from 4 threads while
the worker runs; each task increments a counter in the Redis server (the same
cost in both runs), and `tasks_s` is N over the time from the first publish
to the counter reaching N. Prints one JSON line:
`{"bench": "celery.tasks_s", "ferry_tasks_s", "redis_tasks_s", "ratio", "target": 1,
"meets_target"}`.

Not a `bench_` suite of its own: bench_idempotence.py calls `main()`; run it
alone with `python bench/celery_tasks.py`. This module is also the worker's
app (`celery -A celery_tasks worker`, configured by FERRY_BENCH_CELERY_* env).
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
HERE = Path(__file__).resolve().parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import ferry.celery  # noqa: E402,F401 - registers ferry://
import redis  # noqa: E402
from celery import Celery  # noqa: E402

TASKS = int(os.environ.get("FERRY_BENCH_CELERY_TASKS", "2000"))
PUBLISH_THREADS = 4
WORKER_CONCURRENCY = 2
PREFETCH_MULTIPLIER = 8
TIMEOUT_S = 300.0
TARGET_RATIO = 1.0
SEGMENT_BYTES = 64 << 20   # preallocated segments: keep the bench's disk use small
BROKER_ENV, COUNTER_ENV, QUEUE_ENV = ("FERRY_BENCH_CELERY_BROKER", "FERRY_BENCH_CELERY_COUNTER",
                                      "FERRY_BENCH_CELERY_QUEUE")


def make_app(broker: str, queue: str) -> Celery:
    app = Celery("ferry_bench", broker=broker)
    app.conf.update(task_acks_late=True, task_reject_on_worker_lost=True,
                    worker_prefetch_multiplier=PREFETCH_MULTIPLIER, task_default_queue=queue,
                    task_ignore_result=True, broker_connection_retry_on_startup=True,
                    broker_transport_options={"window": 256})
    return app


# -- the worker side: `celery -A celery_tasks worker` in a child process -------------------
app = make_app(os.environ.get(BROKER_ENV, "memory://"), os.environ.get(QUEUE_ENV, "celery"))
_counter: Any = None


@app.task(name="celery_tasks.tick")
def tick() -> None:
    global _counter
    if _counter is None:
        url, _, key = os.environ[COUNTER_ENV].rpartition("#")
        _counter = (redis.Redis.from_url(url), key)
    _counter[0].incr(_counter[1])


# -- the measuring side -------------------------------------------------------------------
def emit(**fields: object) -> None:
    print(json.dumps(fields), flush=True)


def tasks_per_s(broker: str, redis_url: str, work: Path, label: str) -> float:
    """Start a worker on `broker`, publish TASKS ticks, wait for all; tasks/s."""
    from tests.support.procs import spawn
    queue, key = f"bench-{label}-{uuid.uuid4().hex[:8]}", f"bench:{label}:{uuid.uuid4().hex}"
    env = {BROKER_ENV: broker, QUEUE_ENV: queue, COUNTER_ENV: f"{redis_url}#{key}",
           "PYTHONPATH": os.pathsep.join([str(HERE), str(ROOT), os.environ.get("PYTHONPATH", "")])}
    worker = spawn(f"worker-{label}", [sys.executable, "-m", "celery", "-A", "celery_tasks",
                                       "worker", "--pool=prefork",
                                       "-c", str(WORKER_CONCURRENCY), "--without-mingle",
                                       "--without-gossip", "--without-heartbeat", "-l", "info"],
                   work / f"worker-{label}", env)
    counter = redis.Redis.from_url(redis_url)
    try:
        publisher = make_app(broker, queue)
        with publisher.connection_for_write() as conn:
            conn.ensure_connection(max_retries=30)
        _wait_ready(worker)
        publisher.send_task("celery_tasks.tick")   # warm-up: routes, connections, the pool
        _wait_count(counter, key, 1, worker, label)
        t0 = time.perf_counter()
        with ThreadPoolExecutor(PUBLISH_THREADS) as pool:
            list(pool.map(lambda _: publisher.send_task("celery_tasks.tick"), range(TASKS)))
        _wait_count(counter, key, TASKS + 1, worker, label)
        elapsed = time.perf_counter() - t0
        publisher.close()
    finally:
        worker.stop()
        counter.close()
    return TASKS / elapsed


def _wait_ready(worker: Any) -> None:
    deadline = time.monotonic() + 60
    while " ready." not in worker.log():
        if not worker.alive() or time.monotonic() > deadline:
            raise RuntimeError(f"worker not ready:\n{worker.log()[-2000:]}")
        time.sleep(0.1)


def _wait_count(counter: Any, key: str, n: int, worker: Any, label: str) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while int(counter.get(key) or 0) < n:
        if time.monotonic() > deadline or not worker.alive():
            raise RuntimeError(f"{label}: {counter.get(key)} of {n} tasks ran:\n"
                               f"{worker.log()[-2000:]}")
        time.sleep(0.005)


def start_ferry(work: Path) -> tuple[list[Any], str]:
    """etcd, one namesrv and one async-flush broker; the namesrv address once the broker routes."""
    from tests.support.procs import free_port, spawn, start_etcd, wait_for_http
    etcd = start_etcd(work / "etcd")
    ns_port, br_port = free_port(), free_port()
    prefix = f"/bench-celery-{os.getpid()}/"
    py = sys.executable
    namesrv = spawn("namesrv", [py, "-m", "ferry_namesrv"], work / "namesrv", env={
        "FERRY_NAMESRV_PORT": str(ns_port), "FERRY_NAMESRV_ETCD": etcd.endpoint,
        "FERRY_NAMESRV_ETCD_PREFIX": prefix, "FERRY_NAMESRV_LOG_LEVEL": "WARNING"})
    broker = spawn("broker", [py, "-m", "ferry_broker"], work / "broker", env={
        "FERRY_BROKER_NAME": "bench-a", "FERRY_BROKER_PORT": str(br_port),
        "FERRY_BROKER_HTTP_PORT": "0", "FERRY_BROKER_DATA_DIR": str(work / "broker" / "data"),
        "FERRY_BROKER_ETCD": etcd.endpoint, "FERRY_BROKER_ETCD_PREFIX": prefix,
        "FERRY_BROKER_FLUSH_MODE": "async", "FERRY_BROKER_LOG_LEVEL": "WARNING",
        "FERRY_BROKER_SEGMENT_BYTES": str(SEGMENT_BYTES)})
    procs = [broker, namesrv, etcd.proc]
    wait_for_http(f"http://127.0.0.1:{ns_port}/v1/brokers", b"bench-a", timeout_s=30)
    return procs, f"127.0.0.1:{ns_port}"


def main() -> None:
    from tests.support.procs import start_redis
    (ROOT / "var").mkdir(exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="celery-", dir=ROOT / "var"))
    procs: list[Any] = []
    try:
        redis_server = start_redis(work / "redis")
        procs.append(redis_server.proc)
        ferry_procs, namesrv = start_ferry(work)
        procs.extend(ferry_procs)
        ferry_s = tasks_per_s(f"ferry://{namesrv}", redis_server.url, work, "ferry")
        redis_s = tasks_per_s(redis_server.url, redis_server.url, work, "redis")
        ratio = ferry_s / redis_s
        emit(bench="celery.tasks_s", tasks=TASKS, ferry_tasks_s=round(ferry_s),
             redis_tasks_s=round(redis_s), ratio=round(ratio, 2), target=TARGET_RATIO,
             meets_target=ratio >= TARGET_RATIO)
    finally:
        for proc in procs:
            proc.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
