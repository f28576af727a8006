"""What both ends of a link run beside their frame loops: an idle watchdog and a task group.

Each side notes when it last heard its peer; a watchdog that looks twice a
heartbeat interval ends a link whose peer went silent, even while the other side
is blocked writing to a peer that stopped reading (a SIGSTOPped slave). This
replaces a timeout per read, which would cost a task per frame.
"""
from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any


async def watch_idle(heard_at: Callable[[], float], timeout_ms: int, what: str) -> None:
    """Raise TimeoutError once `heard_at()` (loop time) is older than `timeout_ms`."""
    loop = asyncio.get_running_loop()
    while True:
        idle_s = loop.time() - heard_at()
        if idle_s * 1000 > timeout_ms:
            raise TimeoutError(f"{what} silent for {idle_s:.1f} s")
        await asyncio.sleep(timeout_ms / 4000)


async def until_first_ends(*coros: Coroutine[Any, Any, None]) -> None:
    """Run the coroutines together until one ends; cancel the others; raise its error."""
    tasks = [asyncio.create_task(c) for c in coros]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            task.result()
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
