"""What replication costs and how fast a group fails over: `make bench BENCH=replication`.

`replication.produce`: the producer load of `mesh.produce` (1 KiB messages,
`send_batch` of 256, 16 batches in flight, one producer process) against, in
the same run, a lone broker (replication none), a master with an async slave,
and a master with a sync slave (acknowledged once the slave has it). Real
processes: etcd, namesrv, brokers; each setup is started fresh and stopped.
Target: `ratio_sync_to_none` >= 0.6.

`replication.failover`: a sync PAIR (a master and one slave, in the in-sync
set) with the default election lease; one producer sends 1 KiB messages back
to back; the master gets kill -9; `ms` is the time from the kill until a send
is acknowledged again (by the new master, whose in-sync set is then itself
alone: min_insync_replicas 1). Target: <= 5,000 ms. Targets are reported,
never asserted. `FERRY_BENCH_REPL_FAILOVER_BROKERS` changes the group size.
"""
from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench_mesh import ferry_wait_route  # noqa: E402
from ferry import Producer  # noqa: E402
from ferry.errors import FerryError  # noqa: E402
from mesh_ferry import ferry_produce  # noqa: E402
from mesh_workload import BATCH, BODY  # noqa: E402

from tests.support.ha import Cluster, start_cluster  # noqa: E402
from tests.support.procs import start_etcd  # noqa: E402

# A whole number of batches; smaller than mesh.produce's run: three setups, each stored twice.
TOTAL = int(os.environ.get("FERRY_BENCH_REPL_MESSAGES", "100096")) // BATCH * BATCH
SEGMENT_BYTES = 64 << 20
ELECTION_TTL_S = 3              # the brokers' default lease
FAILOVER_WARMUP_S = 1.0         # sending before the kill, so the producer is warm
FAILOVER_GIVE_UP_S = 30.0
FAILOVER_BROKERS = int(os.environ.get("FERRY_BENCH_REPL_FAILOVER_BROKERS", "2"))
PRODUCE_TARGET_RATIO = 0.6
FAILOVER_TARGET_MS = 5_000


def emit(**fields: object) -> None:
    print(json.dumps(fields), flush=True)


def _cluster(etcd_endpoint: object, work: Path, replication: str,
             per_group: int = 2) -> Cluster:
    return start_cluster(etcd_endpoint, work, replication=replication,  # type: ignore[arg-type]
                         per_group=1 if replication == "none" else per_group,
                         election_ttl_s=ELECTION_TTL_S,
                         broker_env={"FERRY_BROKER_SEGMENT_BYTES": str(SEGMENT_BYTES),
                                     "FERRY_BROKER_LOG_LEVEL": "WARNING"})


def produce_rate(etcd: object, work: Path, replication: str) -> float:
    cluster = _cluster(etcd, work / replication, replication)
    try:
        asyncio.run(ferry_wait_route(cluster.namesrv, "bench"))
        return asyncio.run(ferry_produce(cluster.namesrv, "bench", TOTAL))
    finally:
        cluster.stop()
        shutil.rmtree(work / replication, ignore_errors=True)


async def _failover(cluster: Cluster) -> dict[str, object]:
    old, old_epoch = cluster.wait_master("broker-a")
    async with Producer(namesrv=cluster.namesrv, retries=1_000, retry_backoff_ms=50,
                        request_timeout_ms=2_000, linger_ms=0) as producer:
        await ferry_wait_route(cluster.namesrv, "failover")
        killed_at: float | None = None
        recovered_at: float | None = None
        failed = 0
        start = time.monotonic()
        while recovered_at is None and time.monotonic() - start < FAILOVER_GIVE_UP_S:
            if killed_at is None and time.monotonic() - start >= FAILOVER_WARMUP_S:
                old.kill9()
                killed_at = time.monotonic()
            try:
                await producer.send_and_wait("failover", BODY)
            except FerryError:
                failed += 1
                continue
            if killed_at is not None:
                recovered_at = time.monotonic()
    new = cluster.master("broker-a")
    out: dict[str, object] = {"old_master": old.label, "old_epoch": old_epoch,
                              "new_master": new[0].label if new else None,
                              "new_epoch": new[1] if new else None, "sends_failed": failed}
    if killed_at is None or recovered_at is None:
        return {**out, "ms": None, "error": f"no send succeeded within {FAILOVER_GIVE_UP_S}s"}
    return {**out, "ms": round((recovered_at - killed_at) * 1000)}


def failover(etcd: object, work: Path) -> dict[str, object]:
    cluster = _cluster(etcd, work / "failover", "sync", FAILOVER_BROKERS)
    try:
        return asyncio.run(_failover(cluster))
    finally:
        cluster.stop()
        shutil.rmtree(work / "failover", ignore_errors=True)


def main() -> None:
    (ROOT / "var").mkdir(exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="replication-", dir=ROOT / "var"))
    etcd = None
    try:
        etcd = start_etcd(work / "etcd")
        rates = {mode: produce_rate(etcd, work, mode) for mode in ("none", "async", "sync")}
        ratio = rates["sync"] / rates["none"]
        emit(bench="replication.produce", messages=TOTAL, batch=BATCH,
             none_msgs_s=round(rates["none"]), async_msgs_s=round(rates["async"]),
             sync_msgs_s=round(rates["sync"]),
             ratio_async_to_none=round(rates["async"] / rates["none"], 2),
             ratio_sync_to_none=round(ratio, 2), target_ratio=PRODUCE_TARGET_RATIO,
             meets_target=ratio >= PRODUCE_TARGET_RATIO)
        result = failover(etcd, work)
        ms = result.get("ms")
        emit(bench="replication.failover", replication="sync", brokers=FAILOVER_BROKERS,
             election_ttl_s=ELECTION_TTL_S, **result,
             target_ms=FAILOVER_TARGET_MS,
             meets_target=isinstance(ms, int) and ms <= FAILOVER_TARGET_MS)
    finally:
        if etcd is not None:
            etcd.proc.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
