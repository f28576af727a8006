"""The transport's arrival signal for Celery's hub (`ferry.celery.eventloop.Wakeup`).

The hub sleeps in poll() on the Wakeup's pipe; the Ferry loop thread calls
`set()` for each arrival. Whatever the interleaving of the two threads, an
arrival after the hub drained the pipe must make the pipe readable again, or
the worker sees messages only on its timers' ticks (Celery's suite: control
replies came 10 s late and `inspect()` got none).
"""
from __future__ import annotations

import os
import select
import threading
import time

import pytest
from ferry.celery import eventloop
from ferry.celery.eventloop import Wakeup


def readable(wakeup: Wakeup, timeout_s: float = 0.0) -> bool:
    return bool(select.select([wakeup.fileno()], [], [], timeout_s)[0])


def test_a_set_during_drain_leaves_later_arrivals_waking_the_hub(
        monkeypatch: pytest.MonkeyPatch) -> None:
    wakeup = Wakeup()
    wakeup.set()
    assert readable(wakeup)
    real_read = os.read
    calls = 0

    def read_while_the_loop_thread_sets(fd: int, n: int) -> bytes:
        nonlocal calls
        calls += 1
        if calls == 1:   # the other thread's set() lands in the middle of drain()
            wakeup.set()
        return real_read(fd, n)

    monkeypatch.setattr(eventloop.os, "read", read_while_the_loop_thread_sets)
    wakeup.drain()
    monkeypatch.setattr(eventloop.os, "read", real_read)
    # what arrived during drain() is handed over by the deliver_ready() that follows it;
    # the next arrival must wake the hub
    wakeup.set()
    assert readable(wakeup), "an arrival after drain() left the pipe empty: the hub sleeps on"


def test_every_burst_of_arrivals_wakes_a_polling_hub() -> None:
    """Two real threads: a setter in bursts, a hub that polls, drains and counts what it
    saw. After each burst the hub must wake (no burst seen only by a timeout)."""
    wakeup = Wakeup()
    arrived = 0
    seen = 0
    stop = threading.Event()
    missed: list[int] = []

    def hub() -> None:
        nonlocal seen
        while not stop.is_set():
            if readable(wakeup, 0.5):
                wakeup.drain()
                seen = arrived   # deliver_ready: takes everything that arrived so far
            elif seen != arrived:
                missed.append(arrived - seen)   # arrivals left behind, the pipe silent
                seen = arrived

    thread = threading.Thread(target=hub)
    thread.start()
    try:
        for burst in range(300):
            for _ in range(1 + burst % 7):
                arrived += 1
                wakeup.set()
            time.sleep(0.002 if burst % 3 else 0)
        deadline = time.monotonic() + 5
        while seen != arrived and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        stop.set()
        thread.join()
    assert seen == arrived and not missed, f"arrivals seen only after a poll timeout: {missed}"
