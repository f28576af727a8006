"""delay.failover (part of `make bench BENCH=delay`): the leading scheduler's machine is lost.

Two scheduler instances (lease TTL 2 s) over the bench mesh; FAILOVER_PENDING
delayed messages due over 20-60 s from the start of sending; once the leader
took them all over and 25 s have passed, it is killed (SIGKILL) and its data
directory deleted. Reports `lost` (never received), `early`, `failover_ms`
(kill -> the standby leads), `duplicates` (arrivals of an id already received,
at-least-once) next to the new leader's `duplicates_after_crash` (its upper
bound), and the lateness of the messages due in the failover window (the kill
and the WINDOW_MS after it): `lateness_p99_ms`.
Targets: lost 0, early 0, lateness_p99_ms <= 5000.
"""
from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from ferry.codec import DELIVER_AT_MS, decode_properties, iter_records
from ferry.wire import RequestCode

from tests.support.procs import Proc, free_port, spawn, wait_until_ready

FAILOVER_PENDING = int(os.environ.get("FERRY_BENCH_DELAY_FAILOVER", "100000"))
WINDOW_MS = 10_000
TTL_S = 2
TAKEOVER_LIMIT_S = 60  # no leader by then: failover_ms is null (the takeover is broken)


def _stats(port: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/stats", timeout=10) as resp:
        return json.loads(resp.read())


def _role(port: int) -> str:
    try:
        return str(_stats(port)["role"])
    except OSError:
        return "down"


def start_scheduler(work: Path, name: str, namesrv: str, etcd: str, prefix: str
                    ) -> tuple[Proc, int, Path]:
    port = free_port()
    data = work / name / "data"
    proc = spawn(name, [sys.executable, "-m", "ferry_delay_scheduler"], work / name, env={
        "FERRY_DELAY_SCHEDULER_HTTP_PORT": str(port),
        "FERRY_DELAY_SCHEDULER_DATA_DIR": str(data), "FERRY_DELAY_SCHEDULER_NAMESRV": namesrv,
        "FERRY_DELAY_SCHEDULER_ETCD": etcd, "FERRY_DELAY_SCHEDULER_ETCD_PREFIX": prefix,
        "FERRY_DELAY_SCHEDULER_INSTANCE_ID": name,
        "FERRY_DELAY_SCHEDULER_LEADER_TTL_S": str(TTL_S),
        "FERRY_DELAY_SCHEDULER_SEGMENT_BYTES": str(64 << 20),
        "FERRY_DELAY_SCHEDULER_LOG_LEVEL": "WARNING"})
    wait_until_ready(proc, f"http://127.0.0.1:{port}/readyz", 30)
    return proc, port, data


async def failover(sender: Any, work: Path, namesrv: str, etcd: str, prefix: str) -> dict:
    """Run the case with `sender` (bench_delay.Sender); the fields of its JSON line."""
    n = FAILOVER_PENDING
    scheds = [start_scheduler(work, f"sched-{i}", namesrv, etcd, prefix) for i in (1, 2)]
    try:
        deadline = time.monotonic() + 30
        while "leader" not in {_role(p) for _, p, _ in scheds} and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        topic = "delay-failover"
        queues = await sender.queues(topic)
        received: dict[bytes, int] = {}  # msg id -> lateness at the consumer (ms)
        due_of: dict[bytes, int] = {}
        arrivals = [0]
        pool_tasks = [asyncio.create_task(_poll(addr, qid, topic, received, due_of, arrivals))
                      for addr, qid in queues]
        start = int(time.time() * 1000)
        await sender.send_all(topic, [start + 20_000 + i * 40_000 // n for i in range(n)])
        leader = next(s for s in scheds if _role(s[1]) == "leader")
        standby = next(s for s in scheds if s is not leader)
        while int(_stats(leader[1])["taken"]) < n and time.time() * 1000 < start + 25_000:
            await asyncio.sleep(0.2)
        await asyncio.sleep(max(0.0, (start + 25_000 - time.time() * 1000) / 1000))
        killed_ms = int(time.time() * 1000)
        leader[0].kill9()
        shutil.rmtree(leader[2], ignore_errors=True)
        led_by = time.monotonic() + TAKEOVER_LIMIT_S
        while _role(standby[1]) != "leader" and time.monotonic() < led_by:
            await asyncio.sleep(0.05)
        failover_ms: int | None = (int(time.time() * 1000) - killed_ms
                                   if _role(standby[1]) == "leader" else None)
        wait_until = time.monotonic() + 120
        while len(received) < n and time.monotonic() < wait_until:
            await asyncio.sleep(0.1)
        await asyncio.sleep(1.0)
        for t in pool_tasks:
            t.cancel()
        await asyncio.gather(*pool_tasks, return_exceptions=True)
        window = sorted(lat for mid, lat in received.items()
                        if killed_ms <= due_of[mid] < killed_ms + WINDOW_MS)
        p99 = window[min(len(window) - 1, int(len(window) * 0.99))] if window else 0
        return {"messages": n, "lost": n - len(received),
                "early": sum(1 for v in received.values() if v < 0),
                "failover_ms": failover_ms, "duplicates": arrivals[0] - len(received),
                "window_messages": len(window),
                "lateness_p99_ms": p99, "lateness_max_ms": window[-1] if window else 0,
                "duplicates_after_crash": _stats(standby[1])["duplicates_after_crash"]}
    finally:
        for proc, _, _ in scheds:
            proc.stop()


async def _poll(addr: str, qid: int, topic: str, received: dict[bytes, int],
                due_of: dict[bytes, int], arrivals: list[int]) -> None:
    from ferry.client.core.connection import ConnectionPool
    pool = ConnectionPool()
    offset = 0
    try:
        while True:
            resp = await pool.request(addr, RequestCode.PULL, {
                "group": "bench-failover", "topic": topic, "queue_id": qid, "offset": offset,
                "max_count": 1024, "max_wait_ms": 200, "tags": None, "sql": None},
                timeout_ms=10_000)
            got = int(time.time() * 1000)
            if resp.fields.get("status") == "FOUND":
                for rec in iter_records(resp.body):
                    arrivals[0] += 1
                    due = int(decode_properties(rec.properties_raw)[DELIVER_AT_MS])
                    due_of[rec.msg_id] = due
                    # the broker's store time decides "early"; the receive time the lateness
                    if rec.store_ts_ms < due:
                        received[rec.msg_id] = rec.store_ts_ms - due
                    else:
                        received.setdefault(rec.msg_id, got - due)
            offset = int(resp.fields.get("next_offset", offset))
    finally:
        await pool.close()
