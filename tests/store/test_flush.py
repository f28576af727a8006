"""The flush thread: interval flushes, group commit, timeouts, failures."""
from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from ferry.errors import FlushTimeoutError, StoreError
from ferry.store.commit_log import CommitLog
from ferry.store.flush import FlushService

from tests.store.log_writer import LogWriter


def _service(cl: CommitLog, **kw: int) -> tuple[FlushService, list[int]]:
    checkpoints: list[int] = []
    svc = FlushService(cl, interval_ms=kw.get("interval_ms", 50),
                       timeout_ms=kw.get("timeout_ms", 2000),
                       checkpoint_interval_ms=kw.get("checkpoint_interval_ms", 100),
                       on_checkpoint=lambda: checkpoints.append(cl.flushed_offset))
    svc.start()
    return svc, checkpoints


def test_interval_flush_and_checkpoints(tmp_path: Path) -> None:
    cl = CommitLog(str(tmp_path), 1 << 20)
    cl.set_positions(0)
    svc, checkpoints = _service(cl)
    LogWriter(str(tmp_path), cl).append([b"x" * 100])
    deadline = time.monotonic() + 2
    while cl.flushed_offset < cl.write_offset and time.monotonic() < deadline:
        time.sleep(0.01)
    assert cl.flushed_offset == cl.write_offset
    time.sleep(0.3)
    assert checkpoints
    svc.stop()
    cl.close()


def test_group_commit_shares_one_future(tmp_path: Path) -> None:
    cl = CommitLog(str(tmp_path), 1 << 20)
    cl.set_positions(0)
    svc, _ = _service(cl, interval_ms=10_000, checkpoint_interval_ms=10_000)
    writer = LogWriter(str(tmp_path), cl)
    futures = []
    for _ in range(50):
        writer.append([b"y" * 64])
        futures.append(svc.wait_durable(cl.write_offset))
    for f in futures:
        f.result(timeout=5)
    assert cl.flushed_offset >= cl.write_offset
    assert len({id(f) for f in futures}) < 50  # appends shared flushes
    done = svc.wait_durable(cl.write_offset)  # already durable: resolved at once
    assert done.done()
    svc.stop()
    with pytest.raises(StoreError):
        svc.wait_durable(cl.write_offset + 1).result(timeout=1)
    cl.close()


class _StuckLog:
    """A commit log whose disk hangs in fdatasync until released."""

    def __init__(self) -> None:
        self.write_offset = 100
        self.flushed_offset = 0
        self.release = threading.Event()

    def flush(self, target: int | None = None) -> int:
        self.release.wait()
        self.flushed_offset = self.write_offset
        return self.flushed_offset


def test_stuck_fdatasync_times_out_waiters() -> None:
    log = _StuckLog()
    svc = FlushService(log, interval_ms=10, timeout_ms=100, checkpoint_interval_ms=10_000,
                       on_checkpoint=lambda: None)
    svc.start()
    fut = svc.wait_durable(50)
    time.sleep(0.3)
    log.write_offset = 200
    svc.wait_durable(150)  # the next appender notices the overdue flush
    with pytest.raises(FlushTimeoutError):
        fut.result(timeout=1)
    log.release.set()
    svc.stop()


class _BrokenLog(_StuckLog):
    def flush(self, target: int | None = None) -> int:
        raise OSError(5, "EIO")


def test_io_error_fails_waiters() -> None:
    svc = FlushService(_BrokenLog(), interval_ms=10, timeout_ms=1000,
                       checkpoint_interval_ms=10_000, on_checkpoint=lambda: None)
    svc.start()
    fut = svc.wait_durable(50)
    with pytest.raises(StoreError):
        fut.result(timeout=2)
    assert svc.failed is not None
    with pytest.raises(StoreError):
        svc.wait_durable(60).result(timeout=1)
    svc.stop()


def test_a_slow_checkpoint_does_not_hold_group_commits(tmp_path: Path) -> None:
    """The checkpoint runs on its own thread: a SYNC ack never waits behind its syncs."""
    cl = CommitLog(str(tmp_path), 1 << 20)
    cl.set_positions(0)
    in_checkpoint, release = threading.Event(), threading.Event()

    def slow_checkpoint() -> None:
        in_checkpoint.set()
        release.wait(10)
    svc = FlushService(cl, interval_ms=10_000, timeout_ms=5000, checkpoint_interval_ms=10,
                       on_checkpoint=slow_checkpoint)
    svc.start()
    try:
        assert in_checkpoint.wait(5)
        writer = LogWriter(str(tmp_path), cl)
        for _ in range(3):
            writer.append([b"z" * 64])
            svc.wait_durable(cl.write_offset).result(timeout=2)
        assert cl.flushed_offset == cl.write_offset
    finally:
        release.set()
        svc.stop()
        cl.close()


def test_a_failed_checkpoint_fails_waiters_and_stops_the_flush_thread(tmp_path: Path) -> None:
    cl = CommitLog(str(tmp_path), 1 << 20)
    cl.set_positions(0)
    failures: list[BaseException] = []

    def broken_checkpoint() -> None:
        raise OSError(5, "EIO")
    svc = FlushService(cl, interval_ms=10_000, timeout_ms=5000, checkpoint_interval_ms=10,
                       on_checkpoint=broken_checkpoint, on_failure=failures.append)
    svc.start()
    deadline = time.monotonic() + 5
    while svc.failed is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert isinstance(svc.failed, OSError) and len(failures) == 1
    assert not svc.alive
    with pytest.raises(StoreError):
        svc.wait_durable(10).result(timeout=1)
    svc.stop()
    cl.close()


def test_a_deferred_group_waits_for_its_start_or_the_interval(tmp_path: Path) -> None:
    """wait_durable(start=False): appends made in a row share the fdatasync that
    start_pending() begins; a group nobody starts is flushed after the interval."""
    cl = CommitLog(str(tmp_path), 1 << 20)
    cl.set_positions(0)
    svc, _ = _service(cl, interval_ms=300, checkpoint_interval_ms=10_000)
    writer = LogWriter(str(tmp_path), cl)
    try:
        time.sleep(0.05)  # the flush thread is waiting for work
        writer.append([b"a" * 64])
        first = svc.wait_durable(cl.write_offset, start=False)
        writer.append([b"b" * 64])
        second = svc.wait_durable(cl.write_offset, start=False)
        assert first is second and not first.done()
        svc.start_pending()
        second.result(timeout=2)
        assert cl.flushed_offset == cl.write_offset
        writer.append([b"c" * 64])
        t0 = time.monotonic()
        svc.wait_durable(cl.write_offset, start=False).result(timeout=5)  # never started
        assert time.monotonic() - t0 < 2
    finally:
        svc.stop()
        cl.close()
