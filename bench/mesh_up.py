"""`make bench BENCH=mesh` on the mesh that `make up` starts: what a new user gets.

deploy/local_mesh.py runs here as `make up` runs it (every service: etcd, Redis,
namesrv, two brokers, delay scheduler, txn-checker, dedup, console; tracing and
everything else at its default), on free ports with its var/ directory under the
bench's work directory, and a real Prometheus scrapes every service's /metrics
each second. On it, one client process, 1 KiB messages:

- `mesh.produce` (send_batch), `mesh.produce_send` (sliding window of SEND_WINDOW
  futures) and `mesh.produce_burst` (BURST `await producer.send()`, then
  `asyncio.gather` of their futures, repeated: what the aiokafka docs show);
- `mesh.consume` as a fresh group from the earliest offset, through
  `getmany(max_records=CONSUME_MAX_RECORDS)` (`"api": "getmany"`) and through
  `async for` (`"api": "async_for"`).

Every line says `"mesh": "up"` and carries the Redis Streams figure of the same
round (redis-py: XADD pipelined in batches of BATCH, of REDIS_SEND_PIPELINE and of
BURST; XREADGROUP COUNT CONSUME_MAX_RECORDS + XACK, for `async_for` taking every
record's body one by one). Figures are medians over UP_ROUNDS rounds.

Metrics' cost (issue 25): each round runs the mesh twice, with metrics at the default
(on) and with FERRY_METRICS=off in every service (`/metrics` empty, no instruments),
Prometheus scraping both alike; `mesh.metrics_cost` gives each pass's on / off and
`cost` = 1 - the median over rounds of the round's on / off (target <= 0.05). The
modes take turns in the order of each round. Because those figures move by more than
the cost on a shared machine, the line also carries the cost itself: `scrape_cpu_ms`,
the CPU one scrape of every service takes (bench/scrape_cpu.py), and
`scrape_cpu_share`, that at the 1 s scrape interval as a share of the machine's cores
(metrics do no work on the put and pull paths: every instrument is read at scrape time).

Run alone: `python bench/mesh_up.py` (its own Redis; FERRY_BENCH_MESH_MESSAGES and
FERRY_BENCH_UP_ROUNDS make it shorter).
"""
from __future__ import annotations

import asyncio
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import mesh_ferry
import redis
from ferry.client import Admin, Producer
from ferry.client.core.namesrv import NamesrvClient
from ferry.errors import FerryError
from mesh_redis import redis_consume, redis_produce
from mesh_workload import (
    BATCH,
    BURST,
    CLIENT_LOOP,
    CONSUME_MAX_RECORDS,
    REDIS_SEND_PIPELINE,
    SEND_WINDOW,
    TOTAL,
    WARMUP_SENDS,
    emit,
    run_client,
)
from scrape_cpu import scrape_cpu_ms

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:   # run alone: tests.support (the process helpers) from here
    sys.path.append(str(ROOT))
from tests.support.procs import Proc, free_port, spawn, start_redis  # noqa: E402
from tests.support.prometheus import start_prometheus  # noqa: E402

UP_ROUNDS = int(os.environ.get("FERRY_BENCH_UP_ROUNDS", "2"))
METRICS_MODES = ("on", "off")
METRICS_COST_TARGET = 0.05
#: Prometheus's scrape interval here (tests.support.prometheus; 15 s by default in deploy/).
SCRAPE_INTERVAL_S = 1.0
#: The ports deploy/local_mesh.py takes from FERRY_MESH_<NAME>_PORT.
PORT_NAMES = ("ETCD", "ETCD_PEER", "REDIS", "NAMESRV", "BROKER_A", "BROKER_A_HTTP",
              "BROKER_B", "BROKER_B_HTTP", "SCHEDULER", "TXN_CHECKER", "DEDUP", "CONSOLE")
#: The passes of one mesh, in order: (name, topic); consumption reads the batched topic.
PRODUCE_PASSES = (("produce", "up-batch"), ("send", "up-send"), ("burst", "up-burst"))
CONSUME_PASSES = ("getmany", "async_for")
BURST_TOTAL = TOTAL // BURST * BURST


def start_up_mesh(work: Path, metrics: str) -> tuple[Proc, str, dict[str, str]]:
    """`deploy/local_mesh.py up` on free ports under `work`; (its process, the namesrv
    address, each service's /metrics URL as its banner prints them)."""
    env = {f"FERRY_MESH_{name}_PORT": str(free_port()) for name in PORT_NAMES}
    env["FERRY_MESH_VAR_DIR"] = str(work / "var")
    os.environ.pop("FERRY_METRICS", None)   # on: the default, as `make up` has it
    if metrics == "off":
        env["FERRY_METRICS"] = "off"
    proc = spawn("mesh", [sys.executable, str(ROOT / "deploy" / "local_mesh.py"), "up"],
                 work, env)
    deadline = time.monotonic() + 180
    while "Ferry is up" not in proc.log():
        if not proc.alive() or time.monotonic() > deadline:
            proc.stop()
            raise RuntimeError(f"the mesh of `make up` did not come up:\n{proc.log()}")
        time.sleep(0.3)
    urls = dict(re.findall(r"^  (\S+)\s+(http://127\.0\.0\.1:\d+/metrics)$", proc.log(), re.M))
    return proc, f"127.0.0.1:{env['FERRY_MESH_NAMESRV_PORT']}", urls


async def create_topics(namesrv: str, topics: list[str]) -> None:
    """Create each topic, wait until its route names both brokers (a broker adds a new
    topic to its registration a moment later), and write every queue once."""
    admin = Admin(namesrv=namesrv)
    names = NamesrvClient(namesrv)
    await admin.start()
    await names.start()
    try:
        for topic in topics:
            await admin.create_topic(topic)
            deadline = time.monotonic() + 30
            while len(await brokers_of(names, topic)) < 2:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{topic}: the route never named both brokers")
                await asyncio.sleep(0.5)
    finally:
        await names.close()
        await admin.stop()
    async with Producer(namesrv=namesrv) as producer:
        for topic in topics:
            for _ in range(WARMUP_SENDS * 2):   # two brokers' queues
                await producer.send_and_wait(topic, b"warm-up")


async def brokers_of(names: NamesrvClient, topic: str) -> tuple[object, ...]:
    """The brokers the topic's route names now (none while it has no route yet)."""
    try:
        return tuple((await names.get_route(topic)).brokers)
    except FerryError:
        return ()


def one_mesh(work: Path, metrics: str) -> dict[str, float]:
    """Every pass on a fresh mesh of `make up` (removed after); msgs/s by pass name."""
    proc, namesrv, urls = start_up_mesh(work, metrics)
    prom = None
    try:
        prom = start_prometheus(work / "prometheus", urls)
        asyncio.run(create_topics(namesrv, [topic for _, topic in PRODUCE_PASSES]))
        passes: dict[str, Callable[[str, str, int], Coroutine[Any, Any, float]]] = {
            "produce": mesh_ferry.ferry_produce, "send": mesh_ferry.ferry_produce_send,
            "burst": mesh_ferry.ferry_produce_burst}
        rates = {name: run_client(passes[name](namesrv, topic, TOTAL))
                 for name, topic in PRODUCE_PASSES}
        rates["getmany"] = asyncio.run(mesh_ferry.ferry_consume(namesrv, "up-batch", TOTAL, "up-getmany",
                                                     CONSUME_MAX_RECORDS))
        rates["async_for"] = asyncio.run(mesh_ferry.ferry_consume_iter(namesrv, "up-batch", TOTAL,
                                                            "up-async-for"))
        if metrics == "on":   # with its topics and groups in place: what a scrape costs now
            rates["scrape_cpu_ms"] = sum(scrape_cpu_ms(urls).values())
        return rates
    finally:
        if prom is not None:
            prom.proc.stop()
        proc.stop(timeout_s=60)
        shutil.rmtree(work, ignore_errors=True)


def redis_round(client: redis.Redis, i: int) -> dict[str, float]:
    """The Redis Streams counterparts of one round (streams removed after)."""
    stream, burst_stream = f"up-{i}", f"up-burst-{i}"
    rates = {"burst": redis_produce(client, burst_stream, BURST_TOTAL, BURST)}
    client.delete(burst_stream)
    rates["produce"] = redis_produce(client, stream, TOTAL)
    rates["getmany"] = redis_consume(client, stream, TOTAL, "up-getmany", CONSUME_MAX_RECORDS)
    rates["async_for"] = redis_consume(client, stream, TOTAL, "up-each", CONSUME_MAX_RECORDS,
                                       each=True)
    client.delete(stream)
    send_total = TOTAL // REDIS_SEND_PIPELINE * REDIS_SEND_PIPELINE
    rates["send"] = redis_produce(client, stream, send_total, REDIS_SEND_PIPELINE)
    client.delete(stream)
    return rates


def run_up(work: Path, client: redis.Redis) -> None:
    """UP_ROUNDS rounds of both metrics modes and Redis; the `"mesh": "up"` lines."""
    ferry_runs: dict[str, list[dict[str, float]]] = {mode: [] for mode in METRICS_MODES}
    redis_runs: list[dict[str, float]] = []
    for i in range(UP_ROUNDS):
        redis_runs.append(redis_round(client, i))
        for mode in METRICS_MODES if i % 2 == 0 else METRICS_MODES[::-1]:
            ferry_runs[mode].append(one_mesh(work / f"up-{mode}-{i}", mode))

    def median(runs: list[dict[str, float]], name: str) -> float:
        return statistics.median(r[name] for r in runs)

    on = {name: median(ferry_runs["on"], name) for name in ferry_runs["on"][0]}
    off = {name: median(ferry_runs["off"], name) for name in ferry_runs["off"][0]}
    # Each round's on / off pair ran back to back: the median of the pairs' ratios
    # follows the machine's drift less than a ratio of the two medians.
    paired = {name: statistics.median(a[name] / b[name] for a, b in
                                      zip(ferry_runs["on"], ferry_runs["off"], strict=True))
              for name in off}
    scrape_ms = on.pop("scrape_cpu_ms")
    rds = {name: median(redis_runs, name) for name in redis_runs[0]}
    common = {"mesh": "up", "tracing": "default", "metrics": "on", "rounds": UP_ROUNDS}
    for name, bench, extra in (
            ("produce", "mesh.produce", {"batch": BATCH, "messages": TOTAL}),
            ("send", "mesh.produce_send", {"window": SEND_WINDOW, "messages": TOTAL,
                                           "redis_pipeline": REDIS_SEND_PIPELINE,
                                           "target": 4}),
            ("burst", "mesh.produce_burst", {"burst": BURST, "messages": BURST_TOTAL,
                                             "redis_pipeline": BURST, "target": 3})):
        emit(bench=bench, **common, loop=CLIENT_LOOP, **extra, msgs_s=round(on[name]),
             redis_msgs_s=round(rds[name]), ratio=round(on[name] / rds[name], 2))
    for name in CONSUME_PASSES:
        emit(bench="mesh.consume", **common, api=name, max_records=CONSUME_MAX_RECORDS,
             messages=TOTAL, msgs_s=round(on[name]), redis_msgs_s=round(rds[name]),
             ratio=round(on[name] / rds[name], 2), target=8)
    emit(bench="mesh.metrics_cost", mesh="up", rounds=UP_ROUNDS, target_cost=METRICS_COST_TARGET,
         **{f"{name}_msgs_s_on": round(on[name]) for name in on},
         **{f"{name}_msgs_s_off": round(off[name]) for name in off},
         **{f"{name}_cost": round(1 - paired[name], 3) for name in on},
         scrape_cpu_ms=round(scrape_ms, 2), scrape_interval_s=SCRAPE_INTERVAL_S,
         scrape_cpu_share=round(scrape_ms / 1000 / SCRAPE_INTERVAL_S / (os.cpu_count() or 1), 4))


def main() -> None:
    """The `make up` part alone, with its own Redis (appendonly, fsync every second)."""
    (ROOT / "var").mkdir(exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="mesh-up-", dir=ROOT / "var"))
    rds = start_redis(work / "redis", "--appendonly", "yes", "--appendfsync", "everysec")
    client = redis.Redis(host=rds.host, port=rds.port)
    try:
        run_up(work, client)
    finally:
        client.close()
        rds.proc.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
