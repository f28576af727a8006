"""The `ferry://` transport in Celery's event loop (kombu's hub), as Redis and AMQP are.

A worker whose transport is not asynchronous runs Celery's blocking loop
(`synloop`) and a prefork pool that *blocks* the worker's main thread while
every pool process is busy (Celery's put locks): remote control (`celery
inspect`, `revoke`) then waits until a task ends. With an asynchronous
transport Celery runs its hub (`asynloop`), the main thread never blocks on
the pool, and control commands are answered while all processes are busy.

The transport's arrival signal (`Wakeup`: set by the Ferry loop thread when a
record lands in a feed or a fanout subscription) is an Event for
`drain_events` and also a pipe the hub watches: when it is readable, or on
each hub tick (a message kombu could not take before, because its prefetch
was full, may be taken after an ack), the transport hands kombu every message
ready now, up to `MAX_PER_WAKE` at a time.
"""
from __future__ import annotations

import os
import threading
from queue import Empty
from typing import Any

#: Messages handed to kombu per pipe wake or hub tick (then the hub's other work runs).
MAX_PER_WAKE = 64


class Wakeup(threading.Event):
    """An Event that also makes a pipe readable, for Celery's hub (one byte per wait)."""

    def __init__(self) -> None:
        super().__init__()
        self._r, self._w = os.pipe()
        os.set_blocking(self._r, False)
        os.set_blocking(self._w, False)
        self._signalled = False

    def set(self) -> None:
        super().set()
        if not self._signalled:   # one byte until the reader drains: no write per record
            self._signalled = True
            try:
                os.write(self._w, b"!")
            except OSError:   # full (a byte is there already) or closed
                pass

    def fileno(self) -> int:
        return self._r

    def drain(self) -> None:
        """Empty the pipe, then let the next set() write again. The caller hands kombu
        what is ready right after (`on_readable`): an arrival whose set() wrote nothing
        because the flag was still up is one that hand-off sees.

        In this order only: with the flag lowered first, a set() between the two steps
        wrote a byte that the read then took, leaving the flag up on an empty pipe, and
        no later arrival woke the hub again (deliveries only on its timers' ticks:
        control replies 10 s late in Celery's suite)."""
        try:
            while os.read(self._r, 4096):
                pass
        except OSError:   # empty (BlockingIOError) or closed
            pass
        self._signalled = False


class EventLoopTransport:
    """The hub side of the transport (a mixin placed before kombu's virtual Transport)."""

    _ready: Wakeup
    cycle: Any
    channels: list[Any]
    _deliver: Any

    def register_with_event_loop(self, connection: Any, loop: Any) -> None:
        ready = self._ready

        def on_readable() -> None:
            ready.drain()
            self.deliver_ready()
        loop.add_reader(ready.fileno(), on_readable)
        loop.on_tick.add(self.deliver_ready)

    def deliver_broadcasts(self) -> int:
        """Every channel's ready broadcast (control, event) messages first (fanout.py)."""
        return sum(channel.deliver_broadcasts(self._deliver) for channel in list(self.channels))

    def deliver_ready(self) -> None:
        """Hand kombu what is ready now (never waits); signal again if more may be left."""
        if self.cycle is None:
            return
        self.deliver_broadcasts()
        for _ in range(MAX_PER_WAKE):
            try:
                self.cycle.get(self._deliver, timeout=0)
            except Empty:
                return
        self._ready.set()
