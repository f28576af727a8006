"""A request's first step runs at once; only a request that waits becomes a task.

`asyncio.create_task` runs a coroutine's first step a loop turn later, and most
requests (a SEND in async flush mode, a PULL with messages ready, an offset
commit) never wait at all: their task was a turn of latency and a task's
allocation for nothing. Python 3.12 calls this an eager task; the broker runs on
3.11, so `start_eager` drives the coroutine's first step itself and wraps only a
suspended one in a task that goes on from where it stopped (what it waits for,
cancellation and the result all pass through unchanged).

The first step runs inside the caller (the connection's `data_received`), so
it must not need `asyncio.current_task()` before its first await (`asyncio.timeout`
and `TaskGroup` do); no request handler does. It runs in a copy of the caller's
context and the task goes on in that same copy, as all steps of a task run in one:
a context variable set before the first await (an OpenTelemetry span made current
by `with hop_span(...)` around an `await`) is reset in the context it was set in
and never leaks into the connection's later requests.
"""
from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Coroutine, Generator
from typing import Any


def start_eager(coro: Coroutine[Any, Any, None]) -> asyncio.Task[None] | None:
    """Run `coro` up to its first suspension; None if it finished, else the task going on."""
    context = contextvars.copy_context()
    try:
        yielded = context.run(coro.send, None)
    except StopIteration:
        return None
    return asyncio.get_running_loop().create_task(_go_on(coro, yielded), context=context)


async def _go_on(coro: Coroutine[Any, Any, None], yielded: Any) -> None:
    await _Resumed(coro, yielded)


class _Resumed:
    """Awaitable continuing a started coroutine: first hands its task what the coroutine
    yielded (the future it waits for), then relays every value and exception both ways."""

    __slots__ = ("_coro", "_yielded")

    def __init__(self, coro: Coroutine[Any, Any, None], yielded: Any) -> None:
        self._coro = coro
        self._yielded = yielded

    def __await__(self) -> Generator[Any, Any, None]:
        coro, yielded = self._coro, self._yielded
        self._yielded = None
        while True:
            try:
                sent = yield yielded
            except GeneratorExit:
                coro.close()
                raise
            except BaseException as exc:  # cancellation: it goes to the coroutine
                try:
                    yielded = coro.throw(exc)
                except StopIteration:
                    return
                continue
            try:
                yielded = coro.send(sent)
            except StopIteration:
                return
