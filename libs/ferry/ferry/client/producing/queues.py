"""The producer's queue choice: round robin over healthy brokers, or a stable hash for ordered keys.

Plain messages go round robin over the writable queues whose broker has a
live master, skipping brokers that failed in the last `broker_backoff_ms`
(a broker group is skipped only while its route still names the master that
failed: once a failover gives the group a new master, it is used at once).
Ordered messages (a key, or a queue selector, with `ordered=True`) are placed
over the STABLE list of the route's writable queues, whether their broker is
up or not: a key keeps its queue while a broker is down (its sends fail, they
are not moved) and moves only when the route itself changes.

Priorities: on a topic with `priority_levels` L > 1, a message of priority p
(0..3) goes only to the queues of level `p * L // 4` (queue q of a broker's Q
serves level `q * L // Q`), round robin or by key hash within them, so a key
keeps its order within one level.
"""
from __future__ import annotations

import time
import zlib
from collections.abc import Callable, Sequence

from ferry.client.core.message import Message, TopicQueue
from ferry.client.core.namesrv import PRIORITIES, TopicRoute
from ferry.errors import NotMasterError, TopicNotFoundError

QueueSelector = Callable[[Sequence[TopicQueue], Message], TopicQueue]


def check_priority(priority: int) -> int:
    """`priority` if it is 0..3 (3 highest), else ValueError."""
    if type(priority) is not int or not 0 <= priority < PRIORITIES:
        raise ValueError(f"priority must be an integer 0..{PRIORITIES - 1}, got {priority!r}")
    return priority


def _of_level(queues: list[TopicQueue], route: TopicRoute, level: int) -> list[TopicQueue]:
    return [tq for tq in queues if route.queue_level(tq.broker, tq.queue_id) == level]


def pinned(ordered: bool, key: str | None, selector: QueueSelector | None) -> bool:
    """Whether a message keeps its queue on retries: ordered, and placed by a key or a selector."""
    return ordered and (bool(key) or selector is not None)


class QueueChooser:
    """Picks a topic's queue for each message; remembers brokers that failed recently."""

    def __init__(self, broker_backoff_ms: int) -> None:
        self.broker_backoff_ms = broker_backoff_ms
        self._round_robin: dict[str, int] = {}
        # broker name -> (monotonic time it may be used again, the master address that failed)
        self._faulty: dict[str, tuple[float, str | None]] = {}
        #: No broker is marked faulty now: every usable queue takes plain messages (the
        #: producer's per-topic round robin of queues is valid only while this holds).
        self.all_healthy = True
        # per topic: the route the list was built from, and the list
        self._queue_lists: dict[str, tuple[TopicRoute, list[TopicQueue]]] = {}
        self._key_lists: dict[str, tuple[TopicRoute, list[TopicQueue]]] = {}
        # per (topic, priority): the route the lists were built from, its queues (plain, keyed)
        self._level_lists: dict[tuple[str, int],
                                tuple[TopicRoute, list[TopicQueue], list[TopicQueue]]] = {}

    def mark_faulty(self, broker: str, addr: str | None = None) -> None:
        """Skip `broker` for plain messages during the next `broker_backoff_ms`.

        With `addr` (the master that failed), only while the route still names
        that master: a group that failed over to a new master is used again.
        """
        self._faulty[broker] = (time.monotonic() + self.broker_backoff_ms / 1000, addr)
        self.all_healthy = False

    def _skipped(self, route: TopicRoute) -> set[str]:
        """The broker groups plain messages avoid now (expired marks are dropped)."""
        now = time.monotonic()
        for name in [n for n, (until, _) in self._faulty.items() if until <= now]:
            del self._faulty[name]
        self.all_healthy = not self._faulty
        return {n for n, (_, addr) in self._faulty.items()
                if addr is None or route.broker_addr(n) == addr}

    def _levelled(self, topic: str, route: TopicRoute, priority: int,
                  ) -> tuple[list[TopicQueue], list[TopicQueue]]:
        """The plain and the keyed queue lists of `priority`'s level."""
        cached = self._level_lists.get((topic, priority))
        if cached is None or cached[0] is not route:
            level = route.level_of_priority(priority)
            plain = _of_level(self._all_usable(topic, route), route, level)
            keyed = _of_level(self._all_keyed(topic, route), route, level)
            self._level_lists[(topic, priority)] = cached = (route, plain, keyed)
        return cached[1], cached[2]

    def _all_usable(self, topic: str, route: TopicRoute) -> list[TopicQueue]:
        return _per_route(self._queue_lists, topic, route, route.writable_queues)

    def _all_keyed(self, topic: str, route: TopicRoute) -> list[TopicQueue]:
        return _per_route(self._key_lists, topic, route, route.key_queues)

    def usable(self, topic: str, route: TopicRoute, priority: int = 0) -> list[TopicQueue]:
        """The writable queues with a live master, without brokers that failed recently."""
        if route.priority_levels > 1:
            queues = self._levelled(topic, route, priority)[0]
        else:
            queues = self._all_usable(topic, route)
        if not queues:
            if self.key_queues(topic, route, priority):
                # Queues exist, but no group has a master now: a failover is under way.
                raise NotMasterError(f"no broker group of topic {topic} has a master now "
                                     "(failing over)")
            raise TopicNotFoundError(f"topic {topic} has no writable queue on a live broker")
        if not self._faulty:
            return queues
        skipped = self._skipped(route)
        healthy = [tq for tq in queues if tq.broker not in skipped]
        return healthy or queues  # every broker looks faulty: try them anyway

    def all_skipped(self, topic: str, route: TopicRoute, priority: int = 0) -> bool:
        """Whether every usable queue's broker group is skipped now (its master failed)."""
        if not self._faulty:
            return False
        skipped = self._skipped(route)
        return all(tq.broker in skipped for tq in self.usable(topic, route, priority))

    def key_queues(self, topic: str, route: TopicRoute, priority: int = 0) -> list[TopicQueue]:
        """Every writable queue of the route (of the priority's level), up or down: the
        stable list keys hash over."""
        if route.priority_levels > 1:
            queues = self._levelled(topic, route, priority)[1]
        else:
            queues = self._all_keyed(topic, route)
        if not queues:
            raise TopicNotFoundError(f"topic {topic} has no writable queue")
        return queues

    def round_robin(self, topic: str, route: TopicRoute, priority: int = 0) -> TopicQueue:
        queues = self.usable(topic, route, priority)
        n = self._round_robin.get(topic, 0)
        self._round_robin[topic] = n + 1
        return queues[n % len(queues)]

    def by_key(self, topic: str, route: TopicRoute, key: str | None, ordered: bool,
               priority: int = 0) -> TopicQueue:
        """The key's stable queue when ordered, else the next healthy queue (of the level)."""
        if ordered and key:
            queues = self.key_queues(topic, route, priority)
            return queues[zlib.crc32(key.encode()) % len(queues)]
        return self.round_robin(topic, route, priority)

    def choose(self, topic: str, route: TopicRoute, msg: Message, ordered: bool,
               selector: QueueSelector | None) -> TopicQueue:
        if selector is not None:
            # An ordered selector sees the stable list, so its choice does not move
            # with broker health; a plain one sees the healthy queues.
            queues = (self.key_queues(topic, route, msg.priority) if ordered
                      else self.usable(topic, route, msg.priority))
            return selector(queues, msg)
        return self.by_key(topic, route, msg.key, ordered, msg.priority)


def _per_route(lists: dict[str, tuple[TopicRoute, list[TopicQueue]]], topic: str,
               route: TopicRoute, pairs: Callable[[], list[tuple[str, int]]]
               ) -> list[TopicQueue]:
    """`topic`'s queues named by `pairs()` (broker, queue id), made once per route."""
    cached = lists.get(topic)
    if cached is None or cached[0] is not route:
        lists[topic] = cached = (route, [TopicQueue(topic, b, q) for b, q in pairs()])
    return cached[1]
