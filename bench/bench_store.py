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

MB is 10^6 bytes. Everything runs in temp dirs under var/bench, removed after.
`FERRY_BENCH_STORE_MB` changes the data size (default 1024).
"""
from __future__ import annotations

import asyncio
import gc
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from ferry.store import FlushMode, MessageIn, MessageStore, StoreConfig, decode_record, new_msg_id
from ferry.store.checkpoint import Checkpoint, write_checkpoint

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


def bench_read(root: Path) -> None:
    store = MessageStore(StoreConfig(root_dir=str(root)))
    count = 0
    t0 = time.perf_counter()
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


if __name__ == "__main__":
    main()
