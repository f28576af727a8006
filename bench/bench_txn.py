"""Transactional messages on a real mesh: `make bench BENCH=txn`.

Processes: etcd, namesrv, one broker, and the txn-checker (for `txn.check`).
Cases (each one JSON line):

- txn.commit: transactions/s of begin -> commit (the local transaction a
  no-op), IN_FLIGHT at once, and `ratio_to_send` against plain
  `send_and_wait` (IN_FLIGHT at once) measured in the same run on the same
  mesh (target >= 0.4).
- txn.check: CHECK_HALVES halves begun and never ended by the producer (its
  checker answers COMMIT): seconds from the end of their immunity until every
  one is committed by the check-back. Printed with "skipped" when the
  txn-checker service is not built yet.

Sizes come from FERRY_BENCH_TXN_{COMMITS,CHECK_HALVES} (a smoke run: 500, 200).
"""
from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import time
import urllib.request
from collections.abc import Awaitable, Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ferry import Admin, Producer, TransactionProducer, TxnState  # noqa: E402

from tests.support.procs import (  # noqa: E402
    Proc,
    free_port,
    spawn,
    start_etcd,
    wait_for_port,
    wait_until_ready,
)

COMMITS = int(os.environ.get("FERRY_BENCH_TXN_COMMITS", "20000"))
CHECK_HALVES = int(os.environ.get("FERRY_BENCH_TXN_CHECK_HALVES", "10000"))
IN_FLIGHT = 64
BODY = os.urandom(100)
#: The halves of txn.check may be checked this soon after they were stored.
CHECK_IMMUNITY_MS = 2_000
#: How often the txn-checker scans (and asks again after UNKNOWN) in this bench.
CHECK_INTERVAL_MS = 1_000
CHECK_TIMEOUT_S = 600


def emit(**fields: object) -> None:
    print(json.dumps(fields), flush=True)


def start_mesh(work: Path) -> tuple[list[Proc], str, int]:
    """etcd, namesrv, one broker; the namesrv address and the etcd endpoint."""
    etcd = start_etcd(work / "etcd")
    procs = [etcd.proc]
    ns_port, br_port = free_port(), free_port()
    prefix = f"/bench-txn-{os.getpid()}/"
    py = sys.executable
    procs.append(spawn("namesrv", [py, "-m", "ferry_namesrv"], work / "namesrv", env={
        "FERRY_NAMESRV_PORT": str(ns_port), "FERRY_NAMESRV_ETCD": etcd.endpoint,
        "FERRY_NAMESRV_ETCD_PREFIX": prefix, "FERRY_NAMESRV_LOG_LEVEL": "WARNING"}))
    procs.append(spawn("broker", [py, "-m", "ferry_broker"], work / "broker", env={
        "FERRY_BROKER_NAME": "bench-a", "FERRY_BROKER_PORT": str(br_port),
        "FERRY_BROKER_HTTP_PORT": "0", "FERRY_BROKER_DATA_DIR": str(work / "broker" / "data"),
        "FERRY_BROKER_ETCD": etcd.endpoint, "FERRY_BROKER_ETCD_PREFIX": prefix,
        "FERRY_BROKER_SEGMENT_BYTES": str(256 << 20), "FERRY_BROKER_LOG_LEVEL": "WARNING"}))
    wait_for_port("127.0.0.1", ns_port)
    wait_for_port("127.0.0.1", br_port)
    wait_broker_listed(f"127.0.0.1:{ns_port}")
    return procs, f"127.0.0.1:{ns_port}", etcd.endpoint


def wait_broker_listed(namesrv: str, timeout_s: float = 30.0) -> None:
    """Until namesrv lists the broker (its route exists), so the first send finds a queue."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://{namesrv}/v1/brokers", timeout=2) as resp:
                if json.loads(resp.read()).get("brokers"):
                    return
        except (OSError, ValueError):
            pass
        time.sleep(0.1)
    raise RuntimeError(f"namesrv {namesrv} lists no broker after {timeout_s} s")


def start_checker(work: Path, namesrv: str, etcd: str) -> Proc | None:
    """The txn-checker service with a short schedule, or None while it is not built."""
    if importlib.util.find_spec("ferry_txn_checker.app") is None:
        return None
    port = free_port()
    proc = spawn("txn-checker", [sys.executable, "-m", "ferry_txn_checker"], work / "checker",
                 env={"FERRY_TXN_CHECKER_HOST": "127.0.0.1",
                      "FERRY_TXN_CHECKER_HTTP_PORT": str(port),
                      "FERRY_TXN_CHECKER_NAMESRV": namesrv,
                      "FERRY_TXN_CHECKER_ETCD": etcd,
                      "FERRY_TXN_CHECKER_DATA_DIR": str(work / "checker" / "data"),
                      "FERRY_TXN_CHECKER_CHECK_INTERVAL_MS": str(CHECK_INTERVAL_MS),
                      "FERRY_TXN_CHECKER_ROUTE_POLL_MS": "500",
                      "FERRY_TXN_CHECKER_PULL_MAX_WAIT_MS": "200",
                      "FERRY_TXN_CHECKER_LOG_LEVEL": "WARNING"})
    wait_until_ready(proc, f"http://127.0.0.1:{port}/readyz", 30)
    return proc


async def run_workers(n: int, one: Callable[[], Awaitable[object]]) -> float:
    """Seconds to run `one()` n times with IN_FLIGHT workers."""
    left = n

    async def worker() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            await one()
    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(IN_FLIGHT)))
    return time.perf_counter() - t0


async def commit_vs_send(namesrv: str) -> None:
    async with Producer(namesrv=namesrv) as producer:
        await producer.send_and_wait("txn-send", BODY)   # route and connection warm
        send_s = await run_workers(COMMITS, lambda: producer.send_and_wait("txn-send", BODY))
    async with TransactionProducer(group="bench-tx", namesrv=namesrv,
                                   checker=lambda rec: TxnState.UNKNOWN) as tp:
        await (await tp.begin("txn-commit", BODY)).commit()

        async def one() -> None:
            txn = await tp.begin("txn-commit", BODY)
            await txn.commit()
        txn_s = await run_workers(COMMITS, one)
    send_rate, txn_rate = COMMITS / send_s, COMMITS / txn_s
    emit(bench="txn.commit", transactions=COMMITS, in_flight=IN_FLIGHT,
         txn_s=round(txn_rate), send_msgs_s=round(send_rate),
         ratio_to_send=round(txn_rate / send_rate, 3))


async def committed(namesrv: str, topic: str) -> int:
    async with Admin(namesrv=namesrv) as admin:
        return sum(q.max_offset for q in await admin.queue_infos(topic))


async def check_back(namesrv: str) -> None:
    async with TransactionProducer(group="bench-check", namesrv=namesrv,
                                   checker=lambda rec: TxnState.COMMIT) as tp:
        sem = asyncio.Semaphore(IN_FLIGHT)

        async def begin() -> None:
            async with sem:
                await tp.begin("txn-check", BODY, check_immunity_ms=CHECK_IMMUNITY_MS)
        await asyncio.gather(*(begin() for _ in range(CHECK_HALVES)))
        immune_until = time.monotonic() + CHECK_IMMUNITY_MS / 1000
        deadline = immune_until + CHECK_TIMEOUT_S
        done = 0
        while time.monotonic() < deadline:
            done = await committed(namesrv, "txn-check")
            if done >= CHECK_HALVES:
                break
            await asyncio.sleep(0.2)
        took_s = time.monotonic() - immune_until
    emit(bench="txn.check", halves=CHECK_HALVES, resolved=done,
         seconds_after_immunity=round(took_s, 2), check_immunity_ms=CHECK_IMMUNITY_MS,
         check_interval_ms=CHECK_INTERVAL_MS)


def main() -> None:
    (ROOT / "var").mkdir(exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="txn-", dir=ROOT / "var"))
    procs: list[Proc] = []
    try:
        procs, namesrv, etcd = start_mesh(work)
        asyncio.run(commit_vs_send(namesrv))
        checker = start_checker(work, namesrv, etcd)
        if checker is None:
            emit(bench="txn.check", halves=CHECK_HALVES,
                 skipped="the txn-checker service (ferry_txn_checker.app) is not built yet")
        else:
            procs.append(checker)
            asyncio.run(check_back(namesrv))
    finally:
        for p in reversed(procs):
            p.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
