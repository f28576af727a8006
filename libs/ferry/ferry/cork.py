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
    (or at once through `flush`). `nbytes` is what waits here unwritten.

    `with cork:` holds it: an add inside schedules nothing, and what was added leaves at
    the block's end (the broker, for the answers made while it handles one read)."""

    __slots__ = ("parts", "nbytes", "held", "_write_out", "_scheduled")

    def __init__(self, write_out: Callable[[list[Part]], None]) -> None:
        self.parts: list[Part] = []
        self.nbytes = 0
        self.held = False
        self._write_out = write_out
        self._scheduled = False

    def add(self, parts: list[Part]) -> None:
        """Queue `parts`; the first add of a loop turn schedules the write at its end."""
        self.parts += parts
        self.nbytes += sum(map(len, parts))
        if not self._scheduled and not self.held:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self.flush)

    def add_now(self, parts: list[Part]) -> None:
        """Like `add`, but the first parts of a loop turn leave at once, a turn sooner;
        whatever follows them in the same turn is corked behind them as `add` does.
        At most one write more per loop turn than `add`, and none when held."""
        if self._scheduled or self.held or self.parts:
            self.add(parts)
            return
        self._scheduled = True  # the turn's end clears it: later adds cork until then
        asyncio.get_running_loop().call_soon(self.flush)
        self._write_out(parts)

    def __enter__(self) -> Cork:
        self.held = True
        return self

    def __exit__(self, *exc: object) -> None:
        self.held = False
        if self.parts:
            self.flush()

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
