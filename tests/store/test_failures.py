"""Store failures: checkpoint off the lock, dispatch failures, a dead flush thread,
flush timeouts with no further appends, reads of a closed store."""
from __future__ import annotations

import errno
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from ferry.errors import FlushTimeoutError, StoreError
from ferry.store import GetStatus, MessageIn, MessageStore, StoreConfig, decode_record
from ferry.store import checkpointer as checkpointer_mod
from ferry.store.consume_queue import ConsumeQueue
from ferry.store.consume_queues import ConsumeQueues
from ferry.store.flush import FlushService

SMALL = dict(commitlog_segment_bytes=256 * 1024, max_message_bytes=16 * 1024,
             cq_entries_per_segment=50, index_max_slots=1024, index_max_entries=4096,
             warm_ahead_bytes=0)


def _config(root: Path | str, **kw: object) -> StoreConfig:
    return StoreConfig(root_dir=str(root), **{**SMALL, **kw})  # type: ignore[arg-type]


def _bodies(records: list[memoryview]) -> list[bytes]:
    return [decode_record(r).body for r in records]


@pytest.fixture
def store(tmp_path: Path) -> Iterator[MessageStore]:
    s = MessageStore(_config(tmp_path, checkpoint_interval_ms=3_600_000))
    yield s
    s.close()


def test_checkpoint_syncs_queue_and_index_files_outside_the_store_lock(
        store: MessageStore, monkeypatch: pytest.MonkeyPatch) -> None:
    for q in range(4):
        store.put(MessageIn("t", q, b"x", keys="k"))
    synced: list[tuple[list[str], bool]] = []
    synced_dirs: list[str] = []

    def sync_files(paths: list[str], *, data_only: bool = True) -> None:
        if data_only:
            synced.append((list(paths), store._lock.locked()))
        else:
            synced_dirs.extend(paths)
    monkeypatch.setattr(checkpointer_mod, "sync_files", sync_files)
    store._checkpointer.checkpoint()
    (paths, locked), = synced
    assert not locked
    assert sum("consumequeue" in p for p in paths) == 4 and any("index" in p for p in paths)
    root = store.config.root_dir
    assert {os.path.join(root, "consumequeue"), os.path.join(root, "consumequeue", "t"),
            os.path.join(root, "index")} | {
                os.path.join(root, "consumequeue", "t", str(q)) for q in range(4)} == set(synced_dirs)
    store._checkpointer.checkpoint()  # nothing written since: nothing to sync
    assert synced[1] == ([], False) and len(synced_dirs) == 7


def _fail_creating(monkeypatch: pytest.MonkeyPatch, topic: str) -> None:
    real = ConsumeQueues.get_or_create

    def get_or_create(self: ConsumeQueues, t: str, queue_id: int) -> ConsumeQueue:
        if t == topic and self.find(t, queue_id) is None:
            raise OSError(errno.EMFILE, "Too many open files")
        return real(self, t, queue_id)
    monkeypatch.setattr(ConsumeQueues, "get_or_create", get_or_create)


def test_a_failed_dispatch_stays_pending_and_is_retried(
        store: MessageStore, monkeypatch: pytest.MonkeyPatch) -> None:
    _fail_creating(monkeypatch, "bad")
    store.put_batch([MessageIn("good", 0, b"g"), MessageIn("bad", 0, b"b")])
    assert store.get_messages("good", 0, 0).status is GetStatus.FOUND  # reads keep working
    assert isinstance(store.failure, OSError)
    with pytest.raises(StoreError):
        store.put(MessageIn("good", 0, b"refused"))
    monkeypatch.undo()
    got = store.get_messages("bad", 0, 0)  # the retry applies what was left pending
    assert _bodies(got.records) == [b"b"]
    assert store.max_offset("good", 0) == 1


def test_a_dispatch_failing_until_close_is_rebuilt_on_reopen(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    s = MessageStore(_config(tmp_path))
    _fail_creating(monkeypatch, "bad")
    s.put(MessageIn("good", 0, b"g0"))
    s.put(MessageIn("bad", 0, b"b0"))
    assert s.max_offset("good", 0) == 1
    s.close()
    monkeypatch.undo()
    with MessageStore(_config(tmp_path)) as s2:
        assert not s2.recovery.clean  # a close after a failed dispatch is never clean
        assert _bodies(s2.get_messages("bad", 0, 0).records) == [b"b0"]
        assert s2.put(MessageIn("bad", 0, b"b1")).queue_offset == 1


def test_a_dead_flush_thread_fails_the_store_for_appends_only(tmp_path: Path) -> None:
    s = MessageStore(_config(tmp_path, flush_interval_ms=10))
    s.put(MessageIn("t", 0, b"before"))
    assert s.failure is None and s.flush_thread_alive

    def broken_flush(target: int | None = None) -> int:
        raise OSError(errno.EIO, "Input/output error")
    s._cl.flush = broken_flush  # type: ignore[method-assign]
    s.put(MessageIn("t", 0, b"unflushed"))
    deadline = time.monotonic() + 5
    while s.failure is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert isinstance(s.failure, OSError)
    assert not s.flush_thread_alive
    for put in (lambda: s.put(MessageIn("t", 0, b"x")),
                lambda: s.put_batch([MessageIn("t", 0, b"x")])):
        with pytest.raises(StoreError):
            put()
    assert _bodies(s.get_messages("t", 0, 0).records) == [b"before", b"unflushed"]
    with pytest.raises(StoreError, match="close could not flush"):
        s.close()  # the disk still fails: the files are closed all the same
    del s._cl.flush  # type: ignore[method-assign]
    with MessageStore(_config(tmp_path)) as again:
        assert not again.recovery.clean
        assert _bodies(again.get_messages("t", 0, 0).records) == [b"before", b"unflushed"]


class _StuckLog:
    """A commit log whose fdatasync never returns (a hung disk)."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.write_offset = 100
        self.flushed_offset = 0

    def flush(self, target: int | None = None) -> int:
        self.release.wait()
        return self.flushed_offset


def test_flush_timeout_fires_with_no_further_appends() -> None:
    log = _StuckLog()
    svc = FlushService(log, interval_ms=10, timeout_ms=200, checkpoint_interval_ms=60_000,
                       on_checkpoint=lambda: None)
    svc.start()
    try:
        time.sleep(0.05)  # the flush thread is now stuck in its interval flush
        fut = svc.wait_durable(100)
        t0 = time.monotonic()
        with pytest.raises(FlushTimeoutError):
            fut.result(timeout=3)
        assert time.monotonic() - t0 < 1.5
    finally:
        log.release.set()
        svc.stop()


def test_reads_of_a_closed_store_raise_store_error(tmp_path: Path) -> None:
    s = MessageStore(_config(tmp_path))
    res = s.put(MessageIn("t", 0, b"x", keys="k"))
    s.close()
    for read in (lambda: s.get_messages("t", 0, 0), lambda: s.get_message(res.phy_offset),
                 lambda: s.read_raw(res.phy_offset), lambda: s.min_offset("t", 0),
                 lambda: s.max_offset("t", 0), lambda: s.offset_for_timestamp("t", 0, 0),
                 lambda: s.query_by_key("t", "k", 0, 2**62), lambda: s.query_by_id(res.msg_id),
                 lambda: s.topic_queues(), lambda: s.run_retention()):
        with pytest.raises(StoreError, match="closed"):
            read()


def test_an_io_error_in_a_read_is_a_store_error(store: MessageStore,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    store.put(MessageIn("t", 0, b"x"))

    def no_fds(self: object, *args: object) -> None:
        raise OSError(errno.EMFILE, "Too many open files")
    monkeypatch.setattr(ConsumeQueues, "find", no_fds)
    with pytest.raises(StoreError, match="get_messages failed"):
        store.get_messages("t", 0, 0)
    monkeypatch.undo()
    assert store.get_messages("t", 0, 0).status is GetStatus.FOUND


def test_a_checkpoint_out_of_descriptors_is_retried_not_fatal(
        store: MessageStore, monkeypatch: pytest.MonkeyPatch) -> None:
    store.put(MessageIn("t", 0, b"x"))
    synced: list[str] = []

    def no_fds(paths: list[str], *, data_only: bool = True) -> None:
        raise OSError(errno.EMFILE, "Too many open files")
    monkeypatch.setattr(checkpointer_mod, "sync_files", no_fds)
    store._checkpointer.checkpoint()
    assert store.failure is None
    monkeypatch.setattr(checkpointer_mod, "sync_files",
                        lambda paths, data_only=True: synced.extend(paths))
    store._checkpointer.checkpoint()  # the files the skipped checkpoint took are synced now
    assert any("consumequeue" in p for p in synced) and any("index" in p for p in synced)
