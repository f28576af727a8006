"""The producer's queue choice: round robin over healthy brokers, or a stable hash for ordered keys.

Plain messages go round robin over the writable queues whose broker has a
live master, skipping brokers that failed in the last `broker_backoff_ms`.
Ordered messages (a key, or a queue selector, with `ordered=True`) are placed
over the STABLE list of the route's writable queues, whether their broker is
up or not: a key keeps its queue while a broker is down (its sends fail, they
are not moved) and moves only when the route itself changes.
"""
from __future__ import annotations

import time
import zlib
from collections.abc import Callable, Sequence

from ferry.client.message import Message, TopicQueue
from ferry.client.namesrv import TopicRoute
from ferry.errors import TopicNotFoundError

QueueSelector = Callable[[Sequence[TopicQueue], Message], TopicQueue]


def pinned(ordered: bool, key: str | None, selector: QueueSelector | None) -> bool:
    """Whether a message keeps its queue on retries: ordered, and placed by a key or a selector."""
    return ordered and (bool(key) or selector is not None)


class QueueChooser:
    """Picks a topic's queue for each message; remembers brokers that failed recently."""

    def __init__(self, broker_backoff_ms: int) -> None:
        self.broker_backoff_ms = broker_backoff_ms
        self._round_robin: dict[str, int] = {}
        self._faulty: dict[str, float] = {}   # broker name -> monotonic time it may be used again
        # per topic: the route the list was built from, and the list
        self._queue_lists: dict[str, tuple[TopicRoute, list[TopicQueue]]] = {}
        self._key_lists: dict[str, tuple[TopicRoute, list[TopicQueue]]] = {}

    def mark_faulty(self, broker: str) -> None:
        """Skip `broker` for plain messages during the next `broker_backoff_ms`."""
        self._faulty[broker] = time.monotonic() + self.broker_backoff_ms / 1000

    def usable(self, topic: str, route: TopicRoute) -> list[TopicQueue]:
        """The writable queues with a live master, without brokers that failed recently."""
        cached = self._queue_lists.get(topic)
        if cached is None or cached[0] is not route:
            queues = [TopicQueue(topic, b, q) for b, q in route.writable_queues()]
            self._queue_lists[topic] = cached = (route, queues)
        queues = cached[1]
        if not queues:
            raise TopicNotFoundError(f"topic {topic} has no writable queue on a live broker")
        if not self._faulty:
            return queues
        now = time.monotonic()
        for name in [n for n, until in self._faulty.items() if until <= now]:
            del self._faulty[name]
        healthy = [tq for tq in queues if tq.broker not in self._faulty]
        return healthy or queues  # every broker looks faulty: try them anyway

    def key_queues(self, topic: str, route: TopicRoute) -> list[TopicQueue]:
        """Every writable queue of the route, up or down: the stable list keys hash over."""
        cached = self._key_lists.get(topic)
        if cached is None or cached[0] is not route:
            queues = [TopicQueue(topic, b, q) for b, q in route.key_queues()]
            self._key_lists[topic] = cached = (route, queues)
        if not cached[1]:
            raise TopicNotFoundError(f"topic {topic} has no writable queue")
        return cached[1]

    def round_robin(self, topic: str, route: TopicRoute) -> TopicQueue:
        queues = self.usable(topic, route)
        n = self._round_robin.get(topic, 0)
        self._round_robin[topic] = n + 1
        return queues[n % len(queues)]

    def by_key(self, topic: str, route: TopicRoute, key: str | None, ordered: bool) -> TopicQueue:
        """The key's stable queue when ordered, else the next healthy queue."""
        if ordered and key:
            queues = self.key_queues(topic, route)
            return queues[zlib.crc32(key.encode()) % len(queues)]
        return self.round_robin(topic, route)

    def choose(self, topic: str, route: TopicRoute, msg: Message, ordered: bool,
               selector: QueueSelector | None) -> TopicQueue:
        if selector is not None:
            # An ordered selector sees the stable list, so its choice does not move
            # with broker health; a plain one sees the healthy queues.
            queues = self.key_queues(topic, route) if ordered else self.usable(topic, route)
            return selector(queues, msg)
        return self.by_key(topic, route, msg.key, ordered)
