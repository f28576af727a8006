"""Store benchmarks: what the log store does per second on this machine.

Cases, one JSON line each (`make bench BENCH=store`):

- `store.raw_write`: the machine's ceiling: the same bytes as the async append
  case, written sequentially in 1 MiB chunks with one fdatasync at the end.
- `store.append_async`: 1 KiB messages through `MessageStore.put_batch` in
  batches of 256 (one queue per batch, as a SEND request is), async flush mode.
  Timed until the last put returns (the data is in the page cache, as the broker
  acknowledges it); `close_s` is the final flush on close, reported apart.
- `store.append_sync`: sync flush mode (group commit) with 1, 16 and 256
  concurrent asyncio appenders, each looping `put()` then awaiting
  `asyncio.wrap_future(wait_durable(end_offset))` (`wrap: per_put`); one more
  line with 256 appenders sharing one wrapped Future per flush group
  (`wrap: per_group`), as the broker can since a group shares its Future.
- `store.read`: `get_messages` (32 per pull) over every queue written by the
  async case, decoding every record.
- `store.recovery`: reopen the async case's ~1 GiB store with a stale, unclean
  checkpoint at offset 0, so the whole log is re-verified and re-dispatched.
- `store.twins`: append and read per message with the compiled twins and without
  (`docs/performance.md`, Compiled twins): child processes, alternating compiled,
  pure, pure, compiled, ..., each appending `FERRY_BENCH_STORE_TWIN_MB` (default 256)
  of 1 KiB messages through `put_batch` (`path: put_batch`) and as SEND bodies
  through `put_encoded_batch` (`path: put_encoded`, the broker's path), then reading
  them back. One line per child and case, with the CPU time per message of the
  process (which load changes less than the rate) and msgs/s; then one line per
  case with the medians and the pure/compiled ratio of CPU per message.

Every line says which code ran: `twins` is `compiled` or `pure`.

MB is 10^6 bytes. Everything runs in temp dirs under var/bench, removed after.
`FERRY_BENCH_STORE_MB` changes the data size (default 1024).
"""
from __future__ import annotations

import asyncio
import gc
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ferry import extensions
from ferry.store import FlushMode, MessageIn, MessageStore, StoreConfig, decode_record, new_msg_id
from ferry.store.checkpoint import Checkpoint, write_checkpoint
from ferry.wire import WireMessage, encode_messages

VAR = Path(__file__).resolve().parent.parent / "var" / "bench"
TOPIC = "bench"
QUEUES = 8
BATCH = 256
BODY_BYTES = 1024
CHUNK_BYTES = 1 << 20
PULL_COUNT = 32
SYNC_SECONDS = 3.0
MB = 1e6


def emit(**fields: Any) -> None:
    fields["twins"] = "compiled" if extensions.compiled() else "pure"
    print(json.dumps(fields), flush=True)


def _settle() -> None:
    # Write back the previous case's dirty pages so cases do not pay for each other.
    os.sync()


def make_messages(count: int) -> list[MessageIn]:
    """`count` 1 KiB messages with producer-assigned ids, a tag and one key each."""
    body = os.urandom(BODY_BYTES)
    now_ms = int(time.time() * 1000)
    return [
        MessageIn(topic=TOPIC, queue_id=(i // BATCH) % QUEUES, body=body, tags=f"t{i % 4}",
                  keys=f"order-{i}", msg_id=new_msg_id(), born_ts_ms=now_ms,
                  born_host="10.0.0.5:51234")
        for i in range(count)
    ]


def record_size(work: Path, msg: MessageIn) -> int:
    """The stored size of one of the benchmark's messages."""
    store = MessageStore(StoreConfig(root_dir=str(work / "probe")))
    try:
        return store.put(msg).size
    finally:
        store.close()


def bench_raw_write(work: Path, total_bytes: int) -> float:
    chunk = os.urandom(CHUNK_BYTES)
    path = work / "raw"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        t0 = time.perf_counter()
        left = total_bytes
        while left > 0:
            left -= os.write(fd, chunk if left >= CHUNK_BYTES else chunk[:left])
        os.fdatasync(fd)
        elapsed = time.perf_counter() - t0
    finally:
        os.close(fd)
    path.unlink()
    mb_s = total_bytes / elapsed / MB
    emit(bench="store.raw_write", mb_s=round(mb_s, 1), bytes=total_bytes, seconds=round(elapsed, 3))
    return mb_s


def bench_append_async(root: Path, msgs: list[MessageIn], raw_mb_s: float) -> None:
    store = MessageStore(StoreConfig(root_dir=str(root), flush_mode=FlushMode.ASYNC))
    total = 0
    t0 = time.perf_counter()
    for i in range(0, len(msgs), BATCH):
        for res in store.put_batch(msgs[i : i + BATCH]):
            total += res.size
    elapsed = time.perf_counter() - t0
    t1 = time.perf_counter()
    store.close()
    close_s = time.perf_counter() - t1
    mb_s = total / elapsed / MB
    emit(bench="store.append_async", msgs_s=round(len(msgs) / elapsed), mb_s=round(mb_s, 1),
         ratio_to_raw=round(mb_s / raw_mb_s, 3), messages=len(msgs), batch=BATCH,
         bytes=total, seconds=round(elapsed, 3), close_s=round(close_s, 3))


def read_all(store: MessageStore) -> int:
    """Pull every queue of TOPIC from its first message, decoding every record; the count."""
    count = 0
    for queue_id in range(QUEUES):
        offset = store.min_offset(TOPIC, queue_id)
        end = store.max_offset(TOPIC, queue_id)
        while offset < end:
            got = store.get_messages(TOPIC, queue_id, queue_offset=offset, max_count=PULL_COUNT,
                                     max_bytes=1 << 20, tag_hashes=None)
            for raw in got.records:
                decode_record(raw)
            count += len(got.records)
            offset = got.next_queue_offset
    return count


def bench_read(root: Path) -> None:
    store = MessageStore(StoreConfig(root_dir=str(root)))
    t0 = time.perf_counter()
    count = read_all(store)
    elapsed = time.perf_counter() - t0
    store.close()
    emit(bench="store.read", msgs_s=round(count / elapsed), messages=count, pull=PULL_COUNT,
         seconds=round(elapsed, 3))


async def _sync_appenders(store: MessageStore, msgs: list[MessageIn], appenders: int,
                          seconds: float, per_group: bool) -> int:
    """Appenders looping put + await durable; returns how many puts were acknowledged.

    `per_group`: wrap each group's shared Future once (what a broker should do)
    instead of once per put.
    """
    deadline = time.perf_counter() + seconds
    done = 0
    last: list[Any] = [None, None]  # the last group's concurrent Future and its asyncio twin

    async def appender(n: int) -> None:
        nonlocal done
        i = n
        while time.perf_counter() < deadline:
            res = store.put(msgs[i % len(msgs)])
            fut = store.wait_durable(res.end_offset)
            if not per_group:
                await asyncio.wrap_future(fut)
            else:
                if fut is not last[0]:
                    last[0], last[1] = fut, asyncio.wrap_future(fut)
                await last[1]
            done += 1
            i += appenders

    await asyncio.gather(*(appender(n) for n in range(appenders)))
    return done


def bench_append_sync(root: Path, msgs: list[MessageIn]) -> None:
    store = MessageStore(StoreConfig(root_dir=str(root), flush_mode=FlushMode.SYNC))
    try:
        for appenders, per_group in ((1, False), (16, False), (256, False), (256, True)):
            t0 = time.perf_counter()
            done = asyncio.run(_sync_appenders(store, msgs, appenders, SYNC_SECONDS, per_group))
            elapsed = time.perf_counter() - t0
            emit(bench="store.append_sync", appenders=appenders, msgs_s=round(done / elapsed),
                 wrap="per_group" if per_group else "per_put", messages=done,
                 seconds=round(elapsed, 3))
    finally:
        store.close()


def bench_recovery(root: Path) -> None:
    # A crash long after the last checkpoint: nothing after offset 0 is trusted.
    write_checkpoint(str(root), Checkpoint(commit_offset=0, dispatch_offset=0, clean=False))
    log_bytes = sum(f.stat().st_size for f in (root / "commitlog").iterdir()) if (
        root / "commitlog").is_dir() else 0
    t0 = time.perf_counter()
    store = MessageStore(StoreConfig(root_dir=str(root)))
    elapsed = time.perf_counter() - t0
    report = store.recovery
    store.close()
    emit(bench="store.recovery", seconds=round(elapsed, 3), log_bytes=log_bytes,
         clean=report.clean, records=report.records_scanned,
         redispatched=report.records_redispatched)


TWIN_RUNS = 4  # child processes per mode
TWIN_CASES = ("append", "read")


def _cpu_us(count: int, cpu0: float) -> float:
    return round((time.process_time() - cpu0) / count * 1e6, 3)


def twin_child(size_mb: int) -> None:
    """One child of `store.twins`: append then read, with whichever code this process runs."""
    VAR.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="store-twins-", dir=VAR))
    try:
        msgs = make_messages(size_mb * (1 << 20) // BODY_BYTES)
        bodies = [encode_messages([WireMessage(body=m.body, tags=m.tags or "", keys=m.keys or "",
                                               msg_id=m.msg_id or b"", born_ts_ms=m.born_ts_ms)
                                   for m in msgs[i:i + BATCH]])
                  for i in range(0, len(msgs), BATCH)]
        gc.freeze()
        for path in ("put_batch", "put_encoded"):
            store = MessageStore(StoreConfig(root_dir=str(work / path), flush_mode=FlushMode.ASYNC))
            t0, cpu0 = time.perf_counter(), time.process_time()
            if path == "put_batch":
                for i in range(0, len(msgs), BATCH):
                    store.put_batch(msgs[i:i + BATCH])
            else:
                for n, body in enumerate(bodies):
                    store.put_encoded_batch(TOPIC, n % QUEUES, body, born_host="10.0.0.5:51234")
            elapsed = time.perf_counter() - t0
            emit(bench="store.twins", case="append", path=path, messages=len(msgs),
                 cpu_us_per_msg=_cpu_us(len(msgs), cpu0), msgs_s=round(len(msgs) / elapsed))
            store.close()
        store = MessageStore(StoreConfig(root_dir=str(work / "put_batch")))
        t0, cpu0 = time.perf_counter(), time.process_time()
        count = read_all(store)
        elapsed = time.perf_counter() - t0
        store.close()
        emit(bench="store.twins", case="read", path="get_messages", messages=count,
             cpu_us_per_msg=_cpu_us(count, cpu0), msgs_s=round(count / elapsed))
    finally:
        shutil.rmtree(work, ignore_errors=True)


def bench_twins() -> None:
    """`store.twins`: children alternating compiled and pure; the medians and their ratio."""
    size_mb = os.environ.get("FERRY_BENCH_STORE_TWIN_MB", "256")
    got: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for run in range(TWIN_RUNS * 2):
        pure = run % 4 in (1, 2)  # compiled, pure, pure, compiled, ...
        env = {**os.environ, extensions.NO_EXTENSIONS_ENV: "1" if pure else "0"}
        out = subprocess.run([sys.executable, __file__, "--twin-child", size_mb], env=env,
                             check=True, capture_output=True, text=True).stdout
        for line in out.splitlines():
            print(line, flush=True)
            row = json.loads(line)
            got.setdefault((row["case"], row["path"], row["twins"]), []).append(row)
    for case, path in sorted({(c, p) for c, p, _ in got}):
        med = {twins: statistics.median(r["cpu_us_per_msg"] for r in got.get((case, path, twins), []))
               for twins in ("compiled", "pure") if (case, path, twins) in got}
        rate = {twins: statistics.median(r["msgs_s"] for r in got[(case, path, twins)])
                for twins in med}
        if len(med) < 2:  # the twins are not built here: nothing to compare
            print(json.dumps(dict(bench="store.twins", case=case, path=path, summary=True,
                                  note="the compiled twins are not built"), flush=True))
            continue
        print(json.dumps(dict(
            bench="store.twins", case=case, path=path, summary=True, runs_each=TWIN_RUNS,
            cpu_us_per_msg_compiled=med["compiled"], cpu_us_per_msg_pure=med["pure"],
            pure_over_compiled=round(med["pure"] / med["compiled"], 3),
            msgs_s_compiled=rate["compiled"], msgs_s_pure=rate["pure"])), flush=True)


def main() -> None:
    size_mb = int(os.environ.get("FERRY_BENCH_STORE_MB", "1024"))
    VAR.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="store-", dir=VAR))
    try:
        count = size_mb * (1 << 20) // BODY_BYTES
        msgs = make_messages(count)
        # A broker does not hold a million messages: keep them out of the cyclic GC's
        # scans, or its full collections would be charged to the store.
        gc.freeze()
        first = record_size(work, msgs[0])  # the rest differ only in tag and key lengths
        total = sum(first + len(m.keys) + len(m.tags) - len(msgs[0].keys) - len(msgs[0].tags)
                    for m in msgs)
        _settle()
        raw_mb_s = bench_raw_write(work, total)
        _settle()
        bench_append_async(work / "async", msgs, raw_mb_s)
        sync_msgs = msgs[: 256 * 64]
        del msgs
        gc.unfreeze()
        gc.collect()
        _settle()
        bench_read(work / "async")
        bench_append_sync(work / "sync", sync_msgs)
        shutil.rmtree(work / "sync")
        _settle()
        bench_recovery(work / "async")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    bench_twins()


if __name__ == "__main__":
    if sys.argv[1:2] == ["--twin-child"]:
        twin_child(int(sys.argv[2]))
    else:
        main()
