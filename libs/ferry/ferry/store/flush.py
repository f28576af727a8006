"""The flush thread: makes the commit log durable, in async or group-commit mode.

ASYNC: every `flush_interval_ms` the thread fdatasyncs what was appended since
the last flush. SYNC (group commit): `wait_durable(end)` hands out a Future
shared by every append since the previous flush began; the thread takes the
whole group, fdatasyncs once and resolves it. So N concurrent appenders cost one
fdatasync per group, not N. A group not resolved within `sync_flush_timeout_ms`
fails with FlushTimeoutError. A small watchdog thread enforces that deadline
(the flush thread itself may be the one stuck in fdatasync), so a waiter on a
stuck disk gets its error even when nothing else is appended.

The periodic checkpoint callback runs on a thread of its own: its fdatasyncs of
consume queues, index, checkpoint file and directory take milliseconds, and a
group commit waiting behind them would hold every SYNC acknowledgement that
long, once a second. The callback keeps its own invariant (it records as
durable only what `CommitLog.flush` confirmed), and `CommitLog.flush` may run on
both threads at once. When either thread dies (an I/O error), every waiter
fails, `failed` holds the cause, `on_failure` is called and both threads end.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from typing import Protocol

from ferry.errors import FlushTimeoutError, StoreError

log = logging.getLogger(__name__)


class Flushable(Protocol):
    """What the flush thread needs of a commit log."""

    @property
    def write_offset(self) -> int: ...

    @property
    def flushed_offset(self) -> int: ...

    def flush(self, target: int | None = None) -> int: ...


class _Group:
    """Appends waiting for the same fdatasync (`started`: the flush thread may take it)."""

    __slots__ = ("future", "deadline", "started")

    def __init__(self, deadline: float, started: bool) -> None:
        self.future: Future[None] = Future()
        self.deadline = deadline
        self.started = started


def _resolve(fut: Future[None], exc: BaseException | None = None) -> None:
    try:
        if exc is None:
            fut.set_result(None)
        else:
            fut.set_exception(exc)
    except InvalidStateError:
        pass  # already failed by the timeout check


class FlushService:
    """Owns the flush thread of one commit log."""

    def __init__(self, commit_log: Flushable, *, interval_ms: int, timeout_ms: int,
                 checkpoint_interval_ms: int, on_checkpoint: Callable[[], None],
                 on_failure: Callable[[BaseException], None] | None = None) -> None:
        self._log = commit_log
        self._interval_s = interval_ms / 1000
        self._timeout_s = timeout_ms / 1000
        self._checkpoint_interval_s = checkpoint_interval_ms / 1000
        self._on_checkpoint = on_checkpoint
        self._on_failure = on_failure
        lock = threading.Lock()
        self._cond = threading.Condition(lock)  # wakes the flush thread
        self._watch = threading.Condition(lock)  # wakes the watchdog
        self._pending: _Group | None = None
        self._inflight: _Group | None = None
        self._stopping = False
        self._stop_checkpoints = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ferry-store-flush", daemon=True)
        self._checkpointer = threading.Thread(target=self._run_checkpoints,
                                              name="ferry-store-checkpoint", daemon=True)
        self._watchdog = threading.Thread(target=self._watch_deadlines,
                                          name="ferry-store-flush-watchdog", daemon=True)
        self.failed: BaseException | None = None

    def start(self) -> None:
        self._thread.start()
        self._checkpointer.start()
        self._watchdog.start()

    @property
    def alive(self) -> bool:
        """True while the flush thread runs (started, not stopped, not failed)."""
        return self._thread.is_alive() and self.failed is None and not self._stopping

    def wait_durable(self, end_offset: int, start: bool = True) -> Future[None]:
        """A Future resolved once the commit log is durable up to `end_offset`.

        `start=False` defers the group's fdatasync to the next `start_pending()`
        (or the next interval, at the latest): a caller that puts several requests
        in a row (the broker, in one event-loop turn) starts the flush once after
        the last of them, so that they share one fdatasync instead of the first
        going alone and the rest waiting for it and then their own.
        """
        if end_offset <= self._log.flushed_offset:
            done: Future[None] = Future()
            done.set_result(None)
            return done
        now = time.monotonic()
        with self._cond:
            if self.failed is not None or self._stopping:
                failed: Future[None] = Future()
                failed.set_exception(StoreError("the store's flush thread is not running"))
                return failed
            group = self._pending
            if group is None:
                group = self._pending = _Group(now + self._timeout_s, start)
                if start:
                    self._cond.notify()
            elif start and not group.started:
                group.started = True
                self._cond.notify()
            return group.future

    def start_pending(self) -> None:
        """Let the flush thread take the pending group now (see `wait_durable`)."""
        with self._cond:
            group = self._pending
            if group is not None and not group.started:
                group.started = True
                self._cond.notify()

    def _watch_deadlines(self) -> None:
        """Watchdog: fail the groups still not durable at their deadline."""
        while True:
            overdue: list[_Group] = []
            with self._cond:
                if self.failed is not None or (self._stopping and not self._thread.is_alive()):
                    return
                now = time.monotonic()
                wait_s = self._timeout_s
                for group in (self._inflight, self._pending):
                    if group is None or group.future.done():
                        continue
                    if now >= group.deadline:
                        overdue.append(group)
                    else:
                        wait_s = min(wait_s, group.deadline - now)
                if not overdue:
                    if self._stopping:
                        wait_s = min(wait_s, 0.05)  # until the flush thread ends
                    self._watch.wait(wait_s)
            for group in overdue:  # outside the lock: callbacks may call wait_durable
                _resolve(group.future, FlushTimeoutError(
                    f"the commit log was not made durable within {self._timeout_s:g} s"))

    def stop(self) -> None:
        """Flush everything, resolve every waiter and end the thread."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
            self._watch.notify()
        self._stop_checkpoints.set()
        if self._thread.ident is not None:
            self._thread.join()
        if self._checkpointer.ident is not None:
            self._checkpointer.join()  # none runs after stop: close() writes the last one
        if self._watchdog.ident is not None:
            self._watchdog.join()

    def _run(self) -> None:
        try:
            while True:
                with self._cond:
                    pending = self._pending
                    if ((pending is None or not pending.started) and not self._stopping
                            and self.failed is None):
                        # Woken by a started group; after the interval, flush anyway.
                        self._cond.wait(self._interval_s)
                    if self.failed is not None:
                        return  # the checkpoint thread failed: the waiters are failed already
                    group, self._pending = self._pending, None
                    self._inflight = group
                    stopping = self._stopping
                    target = self._log.write_offset  # every append of the group is below it
                self._log.flush(target)
                if group is not None:
                    _resolve(group.future)
                    self._inflight = None
                if stopping:
                    return
        except BaseException as exc:  # an I/O error: fail every waiter, refuse new ones
            log.exception("the store's flush thread failed")
            self._die(exc)

    def _run_checkpoints(self) -> None:
        """Checkpoint thread: the callback every `checkpoint_interval_ms` until stopped."""
        try:
            while not self._stop_checkpoints.wait(self._checkpoint_interval_s):
                if self.failed is not None:
                    return
                self._on_checkpoint()
        except BaseException as exc:
            log.exception("the store's checkpoint failed")
            self._die(exc)

    def _die(self, exc: BaseException) -> None:
        """Either thread failed: fail every waiter, refuse new ones, end both threads."""
        with self._cond:
            first = self.failed is None
            if first:
                self.failed = exc
            groups = [g for g in (self._pending, self._inflight) if g is not None]
            self._pending = self._inflight = None
            self._cond.notify()  # the flush thread sees `failed` and ends
            self._watch.notify()
        self._stop_checkpoints.set()
        for g in groups:
            _resolve(g.future, StoreError(f"flush failed: {exc}"))
        if first and self._on_failure is not None:
            self._on_failure(exc)
