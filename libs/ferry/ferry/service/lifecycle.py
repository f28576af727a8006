"""The lifecycle every Ferry service shares: serve until SIGTERM or SIGINT, stop step by step.

A service's app has `start()` and `stop()`; `serve_until_signalled` runs one
between the two, and `stop_step` runs one step of a stop so that a failing
step is logged and the later ones (saving state, closing a store) still run.
"""
from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Awaitable, Callable
from importlib.metadata import PackageNotFoundError, version

from ferry.tasks import cancel_and_wait

log = logging.getLogger(__name__)


async def serve_until_signalled(start: Callable[[], Awaitable[None]],
                                stop: Callable[[], Awaitable[None]]) -> None:
    """Start, serve until SIGTERM or SIGINT, stop (also when start fails)."""
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    try:
        await start()
        await stopping.wait()
    finally:
        await stop()


async def flush_tracing() -> None:
    """Export the process's finished spans now (a stop step, while the service still serves).

    In a thread: the trace-topic exporter may send to a broker served by this very loop."""
    from ferry.telemetry import tracing
    await asyncio.to_thread(tracing().force_flush)


async def stop_tracing() -> None:
    """Flush and stop the process's span exporters (the last stop step of a service)."""
    from ferry.telemetry import tracing
    await asyncio.to_thread(tracing().shutdown)


async def stop_step(name: str, step: Callable[[], Awaitable[None]]) -> None:
    """Run one stop step; a failure is logged, never raised (the next steps must run)."""
    try:
        await step()
    except Exception:
        log.exception("stop step %r failed; going on", name)


def as_step(fn: Callable[[], None]) -> Callable[[], Awaitable[None]]:
    """A synchronous stop step (closing a store, saving a file) as one `stop_step` takes."""
    async def run() -> None:
        fn()
    return run


async def cancel_task(tasks: dict[str, asyncio.Task[None]], name: str) -> None:
    """Cancel the background task `name` (if running), drop it from `tasks`, wait for its end."""
    await cancel_and_wait(tasks.pop(name, None))


async def cancel_tasks(tasks: dict[str, asyncio.Task[None]]) -> None:
    """Cancel every task in `tasks`, one after the other, as `cancel_task` does."""
    for name in list(tasks):
        await cancel_task(tasks, name)


def package_version(distribution: str) -> str:
    """The installed version of `distribution`; "0.0.0" when run from a source tree."""
    try:
        return version(distribution)
    except PackageNotFoundError:
        return "0.0.0"
