"""A deep backlog read cold while a producer keeps its pace: `make bench BENCH=backlog`.

Issue 14's deep-backlog case, on real processes (etcd, namesrv, one broker with
async flush and the production 1 GiB segments, under var/, deleted at the end):

1. Fill: MESSAGES messages of 256 bytes are written by FILL_PROCS producer
   processes with `send_batch` (FILL_BATCH messages a batch, a window of
   FILL_WINDOW batches in flight each): `backlog.fill` gives the fill rate.
   `backlog.disk` then gives the broker's data directory as `du` counts it
   (allocated blocks: the last, preallocated segment counts whole) per message,
   and the commit log's written bytes per message.
2. Phase 1 (`backlog.paced`, `reader: "none"`): one producer sends at a fixed
   PACED_RATE msgs/s, one `send()` per message, for SECONDS; the latency of a
   send counts from its intended send time to its acknowledgement (a stalled
   producer is charged for the sends it delayed: no coordinated omission).
3. The backlog leaves the page cache (fsync, then POSIX_FADV_DONTNEED on the old
   commit-log and consume-queue segments; see backlog_files for why not
   `/proc/sys/vm/drop_caches`), so that the reader reads it from disk;
   `backlog_cached_at_start` is the fraction of the old commit-log segments still
   cached (null: no old segment, the backlog was not evicted: use >= 3M messages).
4. Phase 2 (`backlog.paced`, `reader: "cold"`): the same producer and pace
   while a Consumer of a fresh group (auto_offset_reset="earliest"), in its
   own process (at nice READER_NICE: see _reader_proc), reads from the oldest
   message as fast as it can;
   `backlog.reader` gives its msgs/s. `backlog.cold_cost` compares the phases:
   rate kept (ratio >= RATE_KEPT_TARGET) and p99 within P99_TARGET_RATIO times.

Environment (for quick runs):
  FERRY_BENCH_BACKLOG_MESSAGES  messages written first (default 20,000,000)
  FERRY_BENCH_BACKLOG_SECONDS   length of each paced phase (default 30)
  FERRY_BENCH_BACKLOG_RATE      the paced producer's msgs/s (default 20,000)
  FERRY_BENCH_BACKLOG_FILL_PROCS producer processes that fill the backlog (default 2)
  FERRY_BENCH_BACKLOG_COLD      0: keep the page cache (a "warm" reader, to tell the
                                disk's share of phase 2's cost from the CPU's)
Each case prints one JSON line with a `bench` field.
"""
from __future__ import annotations

import asyncio
import contextlib
import multiprocessing as mp
import os
import shutil
import sys
import tempfile
import time
from multiprocessing.connection import Connection
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_mesh import emit, ferry_wait_route, percentiles, start_ferry, steady_gc  # noqa: E402
from ferry import Consumer, Message, Producer  # noqa: E402

from tests.support.procs import Proc, start_etcd  # noqa: E402

TOPIC = "backlog"
BODY_BYTES = 256
MESSAGES = int(os.environ.get("FERRY_BENCH_BACKLOG_MESSAGES", "20000000"))
SECONDS = float(os.environ.get("FERRY_BENCH_BACKLOG_SECONDS", "30"))
PACED_RATE = int(os.environ.get("FERRY_BENCH_BACKLOG_RATE", "20000"))
FILL_PROCS = int(os.environ.get("FERRY_BENCH_BACKLOG_FILL_PROCS", "2"))
COLD = os.environ.get("FERRY_BENCH_BACKLOG_COLD", "1") != "0"
FILL_BATCH = 1000          # messages per send_batch (256 KiB of bodies)
FILL_WINDOW = 8            # batches in flight per fill process
PACED_YIELD_EVERY = 200    # the paced loop lets acks in at least this often while catching up
READER_GROUP = "backlog-cold-reader"
READER_BATCH = 2048        # getmany's max_records
READER_NICE = 10           # the reader process's niceness (see _reader_proc)
RATE_KEPT_TARGET = 0.98    # phase 2's achieved rate / phase 1's
P99_TARGET_RATIO = 2.0     # phase 2's p99 / phase 1's
DRAIN_TIMEOUT_S = 30.0     # the longest the last paced sends may take to be acknowledged


# -- fill -------------------------------------------------------------------------------
async def _fill(namesrv: str, n: int) -> None:
    body = os.urandom(BODY_BYTES)
    async with Producer(namesrv=namesrv, max_batch_bytes=4 << 20) as producer:
        batch = [Message(body) for _ in range(FILL_BATCH)]
        in_flight: set[asyncio.Future[object]] = set()
        for _ in range(n // FILL_BATCH):
            fut = asyncio.ensure_future(producer.send_batch(TOPIC, batch))
            in_flight.add(fut)
            fut.add_done_callback(in_flight.discard)
            if len(in_flight) >= FILL_WINDOW:
                await asyncio.wait(in_flight, return_when=asyncio.FIRST_COMPLETED)
        await asyncio.gather(*in_flight)


def _fill_proc(namesrv: str, n: int) -> None:
    asyncio.run(_fill(namesrv, n))


def fill(namesrv: str, total: int) -> float:
    """Write `total` messages (a whole number of batches per process); seconds taken."""
    ctx = mp.get_context("spawn")
    per_proc = total // FILL_PROCS
    # daemon: an interrupted bench ends them instead of waiting for them at exit
    procs = [ctx.Process(target=_fill_proc, args=(namesrv, per_proc), daemon=True)
             for _ in range(FILL_PROCS)]
    t0 = time.perf_counter()
    for p in procs:
        p.start()
    for p in procs:
        p.join()
        if p.exitcode != 0:
            raise RuntimeError(f"a fill process failed (exit code {p.exitcode})")
    return time.perf_counter() - t0


# -- disk -------------------------------------------------------------------------------
def du_bytes(path: Path) -> tuple[int, int]:
    """(allocated bytes as du counts them, apparent bytes) of every file under `path`."""
    allocated = apparent = 0
    for dirpath, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                st = os.stat(os.path.join(dirpath, name))
                allocated += st.st_blocks * 512
                apparent += st.st_size
    return allocated, apparent


def disk_case(data_dir: Path, messages: int, commit_log_bytes: int) -> None:
    parts = {}
    for sub in sorted(p for p in data_dir.iterdir() if p.is_dir()):
        parts[sub.name] = du_bytes(sub)[0]
    total = du_bytes(data_dir)[0]
    emit(bench="backlog.disk", messages=messages, body_bytes=BODY_BYTES, du_bytes=total,
         du_bytes_per_msg=round(total / messages, 1),
         commit_log_bytes_per_msg=round(commit_log_bytes / messages, 1),
         du_bytes_by_dir=parts)


def commit_log_written(data_dir: Path) -> int:
    """Bytes written to the commit log: its full segments, and the active one up to
    its data end (to the MiB)."""
    segs = sorted((data_dir / "commitlog").iterdir())
    if not segs:
        return 0
    full = sum(s.stat().st_size for s in segs[:-1])
    return full + _written_part(segs[-1])


def _written_part(seg: Path) -> int:
    """The active segment's bytes before its first all-zero 1 MiB block (its data end)."""
    step = 1 << 20
    with open(seg, "rb") as f:
        size, at = seg.stat().st_size, 0
        while at < size:
            f.seek(at)
            if not any(f.read(step)):
                break
            at += step
    return at


# -- the broker's event loop --------------------------------------------------------------
def loop_stats(pid: int) -> tuple[int, float]:
    """(major page faults, CPU seconds) of the broker's main thread (its event loop) so
    far: a major fault there is the whole broker waiting for the disk."""
    with open(f"/proc/{pid}/task/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    # after the command: state(0) ... minflt(7) cminflt(8) majflt(9) cmajflt(10) utime(11) stime(12)
    return int(fields[9]), (int(fields[11]) + int(fields[12])) / tick


def runqueue_wait_s(pid: int) -> float:
    """Seconds the thread `pid` (a main thread) has waited for a CPU while runnable."""
    with open(f"/proc/{pid}/task/{pid}/schedstat") as f:
        return int(f.read().split()[1]) / 1e9


async def measured_phase(producer: Producer, broker_pid: int) -> dict[str, float]:
    """paced_phase, with the broker loop's major faults and busy share meanwhile, and the
    share of the time the broker's loop and this producer waited for a CPU (on a shared
    machine of few cores, that wait, not the broker, is often what the latency measures)."""
    me = os.getpid()
    faults0, cpu0 = loop_stats(broker_pid)
    waits0 = runqueue_wait_s(broker_pid), runqueue_wait_s(me)
    t0 = time.perf_counter()
    got = await paced_phase(producer, PACED_RATE, SECONDS)
    took = time.perf_counter() - t0
    faults1, cpu1 = loop_stats(broker_pid)
    waits1 = runqueue_wait_s(broker_pid), runqueue_wait_s(me)
    return {**got, "broker_loop_major_faults": faults1 - faults0,
            "broker_loop_cpu_share": round((cpu1 - cpu0) / took, 2),
            "broker_loop_cpu_wait_share": round((waits1[0] - waits0[0]) / took, 3),
            "producer_cpu_wait_share": round((waits1[1] - waits0[1]) / took, 3)}


# -- cache drop -------------------------------------------------------------------------
def backlog_files(data_dir: Path) -> list[Path]:
    """The files only a reader of old messages needs: every commit-log segment but the
    active (last) one, and every consume-queue segment but each queue's last one. The
    writer's working set (the active segments and the index files, whose hash slots
    every append touches at random) stays: in a real broker the page cache's LRU keeps
    it, and dropping it would charge the producer for its own cold index, not the reader."""
    files = sorted((data_dir / "commitlog").iterdir())[:-1]
    for queue_dir in (data_dir / "consumequeue").glob("*/*"):
        files.extend(sorted(p for p in queue_dir.iterdir() if p.is_file())[:-1])
    return files


def drop_cache(data_dir: Path) -> float | None:
    """Take the backlog out of the page cache (POSIX_FADV_DONTNEED after fsync: only the
    pages of `backlog_files`); the fraction of the old commit-log segments still cached
    after, None when there is none (a backlog within the active segment stays cached)."""
    for path in backlog_files(data_dir):
        with contextlib.suppress(OSError):
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
    old = sorted((data_dir / "commitlog").iterdir())[:-1]
    return resident_fraction(old) if old else None


def resident_fraction(files: list[Path], step: int = 1 << 20) -> float:
    """The fraction of `files` in the page cache, probed one byte every `step` without
    reading anything from disk (preadv with RWF_NOWAIT)."""
    probe, hits, total = bytearray(1), 0, 0
    for path in files:
        fd = os.open(path, os.O_RDONLY)
        try:
            for at in range(0, os.fstat(fd).st_size, step):
                total += 1
                try:
                    hits += os.preadv(fd, [probe], at, os.RWF_NOWAIT) == 1
                except BlockingIOError:
                    pass
        finally:
            os.close(fd)
    return round(hits / total, 3) if total else 0.0


# -- the cold reader (its own process) --------------------------------------------------
async def _read(namesrv: str, conn: Connection) -> None:
    async with Consumer(TOPIC, group=READER_GROUP, namesrv=namesrv,
                        auto_offset_reset="earliest", enable_auto_commit=True) as consumer:
        conn.send("joined")
        got, t0 = 0, 0.0
        while not conn.poll():
            batch = await consumer.getmany(timeout_ms=200, max_records=READER_BATCH)
            n = sum(len(v) for v in batch.values())
            if n and not got:
                t0 = time.perf_counter()
                conn.send("reading")
            got += n
        conn.recv()
        conn.send((got, time.perf_counter() - t0 if got else 0.0))


def _reader_proc(namesrv: str, conn: Connection) -> None:
    # Below the producer's priority: on a machine of few cores the reader (which decodes
    # every record in Python) would otherwise take the paced producer's CPU, and the
    # producer's latency would measure the client machine, not the broker.
    os.nice(READER_NICE)
    asyncio.run(_read(namesrv, conn))


# -- the paced producer -----------------------------------------------------------------
async def paced_phase(producer: Producer, rate: int, seconds: float) -> dict[str, float]:
    """Send at `rate` for `seconds`, one send() a message; latencies from intended times."""
    n = int(rate * seconds)
    latencies: list[float] = []
    failed = 0
    body = os.urandom(BODY_BYTES)
    last_ack = 0.0

    def record(intended: float, fut: asyncio.Future[object]) -> None:
        nonlocal failed, last_ack
        if fut.cancelled() or fut.exception() is not None:
            failed += 1
            return
        last_ack = time.perf_counter()
        latencies.append((last_ack - intended) * 1000)

    pending = 0
    drained = asyncio.Event()

    def done(intended: float, fut: asyncio.Future[object]) -> None:
        nonlocal pending
        record(intended, fut)
        pending -= 1
        if pending == 0 and i == n:
            drained.set()

    start = time.perf_counter() + 0.1
    i = 0
    with steady_gc():
        while i < n:
            now = time.perf_counter()
            due = min(n, int((now - start) * rate) + 1)
            if i >= due:
                await asyncio.sleep(start + i / rate - now)
                continue
            sent = 0
            while i < due and sent < PACED_YIELD_EVERY:
                intended = start + i / rate
                fut = await producer.send(TOPIC, body)
                pending += 1
                fut.add_done_callback(lambda f, t=intended: done(t, f))  # type: ignore[misc]
                i += 1
                sent += 1
            await asyncio.sleep(0)
        if pending:
            await asyncio.wait_for(drained.wait(), DRAIN_TIMEOUT_S)
    acked = len(latencies)
    took = max(last_ack - start, 1e-9)
    return {"sent": n, "acked": acked, "failed": failed,
            "msgs_s": round(acked / took), **percentiles(latencies)}


async def run_phases(namesrv: str, data_dir: Path, broker_pid: int) -> None:
    async with Producer(namesrv=namesrv) as producer:
        for _ in range(16):   # the route, the connection, every queue once
            await producer.send_and_wait(TOPIC, b"warm-up")
        alone = await measured_phase(producer, broker_pid)
        emit(bench="backlog.paced", reader="none", rate_target_msgs_s=PACED_RATE,
             seconds=SECONDS, backlog_messages=MESSAGES, **alone)
        cached = drop_cache(data_dir) if COLD else None
        ctx = mp.get_context("spawn")
        here, there = ctx.Pipe()
        reader = ctx.Process(target=_reader_proc, args=(namesrv, there), daemon=True)
        reader.start()
        try:
            for expect in ("joined", "reading"):
                while not here.poll():
                    await asyncio.sleep(0.05)
                    if not reader.is_alive():
                        raise RuntimeError("the cold reader died")
                got = here.recv()
                assert got == expect, got
            cold = await measured_phase(producer, broker_pid)
            here.send("stop")
            while not here.poll():
                await asyncio.sleep(0.05)
            read, took = here.recv()
        finally:
            reader.join(timeout=30)
            if reader.is_alive():
                reader.kill()
        emit(bench="backlog.paced", reader="cold" if COLD else "warm",
             backlog_cached_at_start=cached, rate_target_msgs_s=PACED_RATE,
             seconds=SECONDS, backlog_messages=MESSAGES, **cold)
        emit(bench="backlog.reader", messages=read, seconds=round(took, 1),
             msgs_s=round(read / took) if took else 0)
        emit(bench="backlog.cold_cost",
             rate_ratio=round(cold["msgs_s"] / alone["msgs_s"], 3),
             p99_ratio=round(cold["p99_ms"] / alone["p99_ms"], 2),
             rate_target=RATE_KEPT_TARGET, p99_target=P99_TARGET_RATIO)


def main() -> None:
    (ROOT / "var").mkdir(exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="backlog-", dir=ROOT / "var"))
    procs: list[Proc] = []
    try:
        etcd = start_etcd(work / "etcd")
        procs.append(etcd.proc)
        os.environ["FERRY_TRACING"] = "off"   # the paced figures are the store's and the loop's
        mesh, namesrv = start_ferry(work, etcd.endpoint, "async")
        procs.extend(mesh)
        data_dir = work / "broker" / "data"
        asyncio.run(ferry_wait_route(namesrv, TOPIC))
        total = MESSAGES // (FILL_PROCS * FILL_BATCH) * FILL_PROCS * FILL_BATCH
        took = fill(namesrv, total)
        emit(bench="backlog.fill", messages=total, body_bytes=BODY_BYTES, procs=FILL_PROCS,
             batch=FILL_BATCH, seconds=round(took, 1), msgs_s=round(total / took),
             mb_s=round(total * BODY_BYTES / took / 1e6, 1))
        time.sleep(1.0)   # let the async flush catch up before measuring the disk
        disk_case(data_dir, total, commit_log_written(data_dir))
        asyncio.run(run_phases(namesrv, data_dir, mesh[0].popen.pid))
    finally:
        for p in reversed(procs):
            p.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
