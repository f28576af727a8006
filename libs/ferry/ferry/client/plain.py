"""The producer's per-message fast path state: its loop, per-topic lanes and sampling.

`PlainPath` is mixed into `Producer` (as `SendRetries` is) so that `send`'s hot
path reads these parts directly: the future factory bound to the producer's
loop, the lanes that give plain messages their queue without a chooser call
(`_plain_batcher`), and the sampling countdown (`_sampled`). See
docs/client.md "The plain-message fast path" and docs/perf/producer.md.
"""
from __future__ import annotations

import asyncio
import functools
import itertools
import time
from collections.abc import Callable, Iterator
from typing import Any

from ferry.client.accumulator import QueueBatcher
from ferry.client.message import TopicQueue
from ferry.client.namesrv import RouteCache, RouteEntry, TopicRoute
from ferry.client.queues import QueueChooser
from ferry.client.tracing import sample_gap
from ferry.telemetry import Tracing

_monotonic = time.monotonic
_get_running_loop = asyncio.get_running_loop
#: A lane lives at most this long (a route cache entry set far ahead is still re-read).
_MAX_LANE_S = 60.0


class PlainPath:
    """Loop binding, lanes and sampling of a `Producer` (mixed into it)."""

    _routes: RouteCache
    _chooser: QueueChooser
    _route_entries: Any
    _lanes: dict[str, tuple[RouteEntry, Iterator[QueueBatcher]]]
    _lane_timer: asyncio.TimerHandle | None
    _new_future: Callable[[], asyncio.Future[Any]]
    _tr: Tracing
    _unsampled: int
    _batcher: Callable[[TopicQueue], QueueBatcher]   # the producer's

    def _bind_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        """Make `send`'s futures for `loop`, the one the producer runs in (`start` binds it).

        A producer lives in one loop (its connections and tasks do), so `send`
        does not ask for the running loop each time: in CPython 3.11 that asks
        the OS for the process id (a system call) on every call. asyncio's own
        loop builds futures as its `create_future` does, minus that Python call;
        any other loop (uvloop) by its own method.
        """
        if type(loop).create_future is asyncio.BaseEventLoop.create_future:
            self._new_future = functools.partial(asyncio.Future, loop=loop)
        else:
            self._new_future = loop.create_future

    def _first_future(self) -> asyncio.Future[Any]:
        """`_new_future` before the producer is bound to a loop (not started by `start`)."""
        self._bind_loop(_get_running_loop())
        return self._new_future()

    def _plain_batcher(self, topic: str, route: TopicRoute) -> QueueBatcher:
        """The next queue of the round robin, through the topic's lane when it can have one.

        A lane is a cycle over the batchers of the route's usable queues, kept
        with the route cache's entry it was built from: `send` uses it while
        that entry is the cache's and no broker is marked faulty (then
        `QueueChooser` skips brokers itself). A timer drops the lane when the
        entry goes stale, so that `send` reads no clock.
        """
        if not self._chooser.all_healthy:
            return self._batcher(self._chooser.round_robin(topic, route))
        lane = self._lanes.get(topic)
        entry = self._route_entries.get(topic)
        if lane is None or lane[0] is not entry:
            if entry is None or entry[1] is not route:   # the cache moved on: no lane now
                return self._batcher(self._chooser.round_robin(topic, route))
            batchers = [self._batcher(tq) for tq in self._chooser.usable(topic, route)]
            lane = self._lanes[topic] = (entry, itertools.cycle(batchers))
            stale_in_s = entry[0] + self._routes.refresh_interval_ms / 1000 - _monotonic()
            loop = _get_running_loop()
            due = loop.time() + min(max(stale_in_s, 0.0), _MAX_LANE_S)
            timer = self._lane_timer
            if timer is None or timer.when() > due:   # one timer: the first lane to go stale
                if timer is not None:
                    timer.cancel()
                self._lane_timer = loop.call_at(due, self._drop_lanes)
        return next(lane[1])

    def _drop_lanes(self) -> None:
        """A lane's route went stale: every lane is built again at its topic's next send."""
        self._lane_timer = None
        self._lanes.clear()

    def _sample_next(self) -> bool:
        """Whether the next unforced message is traced (`send`'s countdown ran out)."""
        return bool(self._sampled(1))

    def _sampled(self, n: int) -> list[int]:
        """Which of the next `n` unforced (trace=None) messages are traced, by position.

        `_unsampled` counts the unforced messages still to send untraced before
        the next traced one (-1: not drawn yet); `sample_gap` draws each count.
        """
        picks: list[int] = []
        i = 0
        left = self._unsampled
        while True:
            if left < 0:
                left = sample_gap(self._tr)
            if i + left >= n:
                self._unsampled = left - (n - i)
                return picks
            i += left
            if self._tr.enabled:
                picks.append(i)
            i += 1
            left = sample_gap(self._tr)

    @property
    def _tracing(self) -> Tracing:
        """The tracing this producer's spans go to (replacing it restarts the sampling)."""
        return self._tr

    @_tracing.setter
    def _tracing(self, tr: Tracing) -> None:
        self._tr = tr
        self._unsampled = -1   # drawn from the new tracing's ratio at the next message
