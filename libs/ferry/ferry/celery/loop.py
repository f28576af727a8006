"""A background asyncio event loop on its own thread, for sync callers (kombu, Celery).

Ferry's clients are asyncio; kombu calls its transport from plain threads.
Each kombu connection owns one `LoopThread`: the Ferry clients live on that
loop, and sync code hands them coroutines with `run()` (which waits for the
result) or callbacks with `call_soon()`. A loop does not survive `fork()`
(Celery's prefork pool forks): `alive` is False in a child process, and the
transport then starts a new loop there.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from ferry.errors import RequestTimeoutError

T = TypeVar("T")

#: How long stop() waits for the loop thread to end.
STOP_TIMEOUT_S = 10.0


class LoopThread:
    """One asyncio loop running forever on a daemon thread of this process."""

    def __init__(self, name: str = "ferry-celery-loop") -> None:
        self.name = name
        self._pid = os.getpid()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._thread.start()
        self._ready.wait()

    def _main(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.call_soon(self._ready.set)
        self._loop.run_forever()

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    @property
    def alive(self) -> bool:
        """True in the process that started it, while the loop runs."""
        return (os.getpid() == self._pid and self._thread.is_alive()
                and not self._loop.is_closed())

    def in_loop(self) -> bool:
        return threading.current_thread() is self._thread

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float | None = None) -> T:
        """Run `coro` on the loop and wait for its result (RequestTimeoutError after `timeout_s`)."""
        if self.in_loop():
            coro.close()
            raise RuntimeError("LoopThread.run() called from its own loop: it would deadlock")
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return future.result(timeout_s)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise RequestTimeoutError(f"no answer within {timeout_s} s") from None

    def call_soon(self, fn: Callable[..., Any], *args: Any) -> None:
        """Schedule `fn(*args)` on the loop from any thread (dropped once the loop closed)."""
        if not self._loop.is_closed():
            self._loop.call_soon_threadsafe(fn, *args)

    def stop(self) -> None:
        """Stop the loop and join its thread (a no-op in a forked child: the thread is gone)."""
        if os.getpid() != self._pid or self._loop.is_closed():
            return
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(STOP_TIMEOUT_S)
        if not self._thread.is_alive():
            self._loop.close()
