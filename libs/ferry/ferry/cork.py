"""Corked writes: the frames one connection makes in one event-loop turn leave in one write.

Both ends of a Ferry connection write this way (the client's `BrokerConnection`,
the broker's `BrokerProtocol`): one socket write per loop turn instead of one per
frame, the largest per-request cost when many small requests or responses are in
flight. A leaf: asyncio only.
"""
from __future__ import annotations

import asyncio
from collections.abc import Callable

Part = bytes | memoryview


class Cork:
    """Collects the parts written in one loop turn; `write_out(parts)` runs once, at its end
    (or at once through `flush`). `nbytes` is what waits here unwritten."""

    __slots__ = ("parts", "nbytes", "_write_out", "_scheduled")

    def __init__(self, write_out: Callable[[list[Part]], None]) -> None:
        self.parts: list[Part] = []
        self.nbytes = 0
        self._write_out = write_out
        self._scheduled = False

    def add(self, parts: list[Part]) -> None:
        """Queue `parts`; the first add of a loop turn schedules the write at its end."""
        self.parts += parts
        self.nbytes += sum(map(len, parts))
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self.flush)

    def flush(self) -> None:
        """Hand what waits to `write_out` now (an empty list when nothing does)."""
        self._scheduled = False
        out, self.parts = self.parts, []
        self.nbytes = 0
        self._write_out(out)

    def clear(self) -> None:
        """Drop what waits (the connection is gone)."""
        self.parts = []
        self.nbytes = 0
