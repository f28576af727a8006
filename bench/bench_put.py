"""The broker's write side in CPU per stored message: `make bench BENCH=put`.

What a SEND costs the store and the broker, measured as CPU time per message
(user and system) rather than as a rate alone: on a shared machine rates swing
with the neighbours' load, CPU per message much less (docs/perf/broker.md).
Cases, one JSON line each:

- `put.store_encoded`: the store alone, in-process: `MessageStore.put_encoded_batch`
  of SEND bodies of 256 x 1 KiB entries (ids made as a producer makes them),
  async flush; wall, user and system microseconds per message.
- `put.broker` with `"load": "blast"`: etcd, namesrv and one broker (async
  flush); a raw-wire load of SEND frames (256 x 1 KiB, 2 connections, 8 frames
  in flight each) that costs the client a fraction of a real producer, so the
  broker is what is measured; the broker's user/system CPU per message (from
  /proc/<pid>/stat) and the share of a core it used.
- `put.broker` with `"load": "produce"`: the same broker under bench_mesh's
  producer (`send_batch` of 256 x 1 KiB, 16 batches in flight); `"produce_send"`:
  one `await producer.send()` per message (bench_mesh's `mesh.produce_send` loop).
  Each line also gives this client process's CPU per message
  (`client_us_per_msg`, docs/perf/producer.md); the client runs under asyncio,
  or uvloop with FERRY_BENCH_CLIENT_LOOP=uvloop as in bench_mesh.
- `put.broker` with `"load": "sync_flush"`: a broker in sync flush mode under
  bench_mesh's 64 `send_and_wait` senders (the `mesh.sync_flush` case), with
  the broker's CPU per message.

Group commit in-process (many appenders, one fdatasync) is `store.append_sync`
in bench_store. To profile the broker under a load, run `py-spy record -p <pid>`
on it while this suite runs (py-spy is not a dev requirement: pip install it).
`FERRY_BENCH_PUT_MESSAGES` sets the message count of the store and blast cases
(default 400,128; the produce cases use half).
"""
from __future__ import annotations

import asyncio
import json
import os
import resource
import shutil
import sys
import tempfile
import time
import urllib.request
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

from ferry.codec.entry import append_entry
from ferry.codec.msg_id import new_msg_id
from ferry.store import MessageStore, StoreConfig
from ferry.wire import FrameDecoder, encode_frame, request
from ferry.wire.codes import RequestCode

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(HERE), str(ROOT)]  # bench_mesh beside this file; tests.support from the root

import bench_mesh  # noqa: E402
from mesh_workload import emit  # noqa: E402

from tests.support.procs import Proc, start_etcd  # noqa: E402

TOPIC = "bench"
QUEUES = 8
BATCH = 256
BODY = os.urandom(1024)
MESSAGES = int(os.environ.get("FERRY_BENCH_PUT_MESSAGES", "400128")) // BATCH * BATCH
BLAST_CONNECTIONS = 2
BLAST_WINDOW = 8  # SEND frames in flight per connection
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def send_body(born_ts_ms: int) -> bytes:
    """One SEND body: BATCH entries of BODY, each with a fresh producer-made id."""
    parts: list[bytes] = []
    for _ in range(BATCH):
        append_entry(parts, new_msg_id(), born_ts_ms, 0, b"", b"", b"", BODY)
    return b"".join(parts)


def bench_store_encoded(work: Path) -> None:
    bodies = [send_body(1) for _ in range(32)]
    store = MessageStore(StoreConfig(root_dir=str(work / "store"),
                                     commitlog_segment_bytes=256 << 20))
    try:
        r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        for i in range(MESSAGES // BATCH):
            store.put_encoded_batch(TOPIC, i % QUEUES, bodies[i % len(bodies)],
                                    born_host="127.0.0.1:1")
        elapsed, r1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF)
    finally:
        store.close()
    per_us = 1e6 / MESSAGES
    emit(bench="put.store_encoded", messages=MESSAGES, batch=BATCH, body_bytes=len(BODY),
         msgs_s=round(MESSAGES / elapsed), wall_us_per_msg=round(elapsed * per_us, 3),
         user_us_per_msg=round((r1.ru_utime - r0.ru_utime) * per_us, 3),
         sys_us_per_msg=round((r1.ru_stime - r0.ru_stime) * per_us, 3))


def cpu_s(pid: int) -> tuple[float, float]:
    """User and system CPU seconds of a process so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) / CLOCK_TICKS, int(fields[12]) / CLOCK_TICKS


async def blast_connection(addr: str, frames: int, conn_index: int) -> None:
    """Send `frames` SEND frames over one connection, BLAST_WINDOW in flight."""
    host, port = addr.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    decoder = FrameDecoder()
    answered = 0
    window = asyncio.Semaphore(BLAST_WINDOW)

    async def read_answers() -> None:
        nonlocal answered
        while answered < frames:
            data = await reader.read(1 << 16)
            if not data:
                raise ConnectionError("the broker closed the connection")
            for frame in decoder.feed(data):
                if frame.error:
                    raise RuntimeError(f"SEND refused: {frame.error} {frame.message}")
                answered += 1
                window.release()

    answers = asyncio.ensure_future(read_answers())
    born_ts_ms = int(time.time() * 1000)
    for i in range(frames):
        await window.acquire()
        header = {"topic": TOPIC, "queue_id": (conn_index + i) % QUEUES}
        writer.write(encode_frame(request(RequestCode.SEND, i + 1, header, send_body(born_ts_ms))))
        if answers.done():
            answers.result()
        await writer.drain()
    await answers
    writer.close()


async def blast(addr: str, messages: int) -> float:
    frames = messages // BATCH // BLAST_CONNECTIONS
    t0 = time.perf_counter()
    await asyncio.gather(*(blast_connection(addr, frames, i) for i in range(BLAST_CONNECTIONS)))
    return frames * BLAST_CONNECTIONS * BATCH / (time.perf_counter() - t0)


def broker_addr(namesrv: str) -> str:
    with urllib.request.urlopen(f"http://{namesrv}/v1/brokers", timeout=10) as answer:
        (broker,) = json.load(answer)["brokers"]
    return str(broker["addr"])


def measure_broker(load: str, broker: Proc, run: Coroutine[Any, Any, float],
                   messages: int | None) -> None:
    """Run `run` (a coroutine giving msgs/s) and emit the broker's and this client
    process's CPU per message."""
    pid = broker.popen.pid
    (u0, s0), c0, t0 = cpu_s(pid), resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    rate = bench_mesh.run_client(run)
    (u1, s1), c1 = cpu_s(pid), resource.getrusage(resource.RUSAGE_SELF)
    elapsed = time.perf_counter() - t0
    count = messages if messages is not None else rate * elapsed
    client_s = c1.ru_utime - c0.ru_utime + c1.ru_stime - c0.ru_stime
    emit(bench="put.broker", load=load, loop=bench_mesh.CLIENT_LOOP, messages=round(count),
         msgs_s=round(rate),
         broker_user_us_per_msg=round((u1 - u0) / count * 1e6, 2),
         broker_sys_us_per_msg=round((s1 - s0) / count * 1e6, 2),
         broker_cpu_frac=round((u1 - u0 + s1 - s0) / elapsed, 2),
         client_us_per_msg=round(client_s / count * 1e6, 2))


def bench_broker(work: Path, etcd_endpoint: str, flush_mode: str) -> None:
    procs, namesrv = bench_mesh.start_ferry(work / flush_mode, etcd_endpoint, flush_mode)
    try:
        asyncio.run(bench_mesh.ferry_wait_route(namesrv, TOPIC))
        broker = procs[0]
        if flush_mode == "sync":
            measure_broker("sync_flush", broker, bench_mesh.ferry_sync_flush(namesrv, TOPIC), None)
            return
        blasted = MESSAGES // BATCH // BLAST_CONNECTIONS * BLAST_CONNECTIONS * BATCH
        measure_broker("blast", broker, blast(broker_addr(namesrv), blasted), blasted)
        produced = MESSAGES // 2 // BATCH * BATCH
        measure_broker("produce", broker, bench_mesh.ferry_produce(namesrv, TOPIC, produced),
                       produced)
        measure_broker("produce_send", broker,
                       bench_mesh.ferry_produce_send(namesrv, TOPIC, produced), produced)
    finally:
        for proc in procs:
            proc.stop()


def main() -> None:
    (ROOT / "var").mkdir(exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="put-", dir=ROOT / "var"))
    etcd = None
    try:
        bench_store_encoded(work)
        etcd = start_etcd(work / "etcd")
        bench_mesh.use_tracing("default")
        bench_broker(work, etcd.endpoint, "async")
        bench_broker(work, etcd.endpoint, "sync")
    finally:
        if etcd is not None:
            etcd.proc.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
