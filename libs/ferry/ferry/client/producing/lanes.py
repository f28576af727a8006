"""The producer's lanes: plain messages' round robin over a topic's queues, without a lookup.

A lane is a cycle over the accumulators of the route's usable queues, kept
with the route cache's entry it was built from. `Producer.send` takes the
lane's next accumulator for a plain message while that entry is still the
cache's and no broker is marked faulty (then `QueueChooser` skips brokers
itself); a timer drops the lanes when the entry goes stale, so that `send`
reads no clock. See docs/client.md "The plain-message fast path".
"""
from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable, Iterator
from typing import Any

from ferry.client.core.message import TopicQueue
from ferry.client.core.namesrv import RouteCache, RouteEntry, TopicRoute
from ferry.client.producing.accumulator import QueueBatcher
from ferry.client.producing.queues import QueueChooser

_monotonic = time.monotonic
#: A lane lives at most this long (a route cache entry set far ahead is still re-read).
_MAX_LANE_S = 60.0


class Lanes:
    """Per topic: the route cache entry a lane was built from, and its accumulators' cycle."""

    __slots__ = ("by_topic", "route_entries", "_routes", "_chooser", "_batcher", "_timer")

    def __init__(self, routes: RouteCache, chooser: QueueChooser,
                 batcher: Callable[[TopicQueue], QueueBatcher]) -> None:
        #: read by `Producer.send` directly: its hot path checks a lane inline
        self.by_topic: dict[str, tuple[RouteEntry, Iterator[QueueBatcher]]] = {}
        self.route_entries: Any = routes.entries
        self._routes = routes
        self._chooser = chooser
        self._batcher = batcher
        self._timer: asyncio.TimerHandle | None = None

    def next_batcher(self, topic: str, route: TopicRoute) -> QueueBatcher:
        """The next queue of the round robin, through the topic's lane when it can have one."""
        chooser = self._chooser
        if not chooser.all_healthy:
            return self._batcher(chooser.round_robin(topic, route))
        lane = self.by_topic.get(topic)
        entry = self.route_entries.get(topic)
        if lane is None or lane[0] is not entry:
            if entry is None or entry[1] is not route:   # the cache moved on: no lane now
                return self._batcher(chooser.round_robin(topic, route))
            batchers = [self._batcher(tq) for tq in chooser.usable(topic, route)]
            lane = self.by_topic[topic] = (entry, itertools.cycle(batchers))
            stale_in_s = entry[0] + self._routes.refresh_interval_ms / 1000 - _monotonic()
            loop = asyncio.get_running_loop()
            due = loop.time() + min(max(stale_in_s, 0.0), _MAX_LANE_S)
            timer = self._timer
            if timer is None or timer.when() > due:   # one timer: the first lane to go stale
                if timer is not None:
                    timer.cancel()
                self._timer = loop.call_at(due, self.drop)
        return next(lane[1])

    def drop(self) -> None:
        """A lane's route went stale: every lane is built again at its topic's next send."""
        self._timer = None
        self.by_topic.clear()

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self.drop()
