"""RegistryCache: an in-memory copy of the routing keys, kept current by an etcd watch.

It loads everything under the prefix with one range read (one consistent
revision), then watches the prefix from the next revision, so no change falls
between the two. If the watch fails (etcd restarted, connection lost, history
compacted) it reads everything again and watches again; listeners hear about
the difference. Each namesrv instance, and each broker, answers from its own
cache: etcd stays the only truth.
"""
from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from ferry.routing.follow import PrefixFollower
from ferry.routing.models import BrokerInfo, GroupConfig, TopicConfig
from ferry.routing.registry import EtcdRegistry
from ferry.tasks import cancel_and_wait

log = logging.getLogger("ferry.routing.cache")

BrokerKey = tuple[str, str, int]


@dataclass(frozen=True)
class CacheChange:
    """One change seen by the cache: `value` is None when the key was deleted."""

    kind: str  # "broker" | "topic" | "group"
    key: Any  # BrokerKey for brokers, the name for topics and groups
    value: BrokerInfo | TopicConfig | GroupConfig | None


Listener = Callable[[CacheChange], Awaitable[None] | None]


class RegistryCache(PrefixFollower):
    """Brokers, topics and groups under the registry's prefix, as of `revision`.

    The server side's copy of etcd (namesrv, broker); a client's topic routes come
    from namesrv over HTTP instead (`ferry.client.core.namesrv.RouteCache`)."""

    what = "route cache"

    def __init__(self, registry: EtcdRegistry) -> None:
        super().__init__(registry)
        self.registry = registry
        self.brokers: dict[BrokerKey, BrokerInfo] = {}
        self.topics: dict[str, TopicConfig] = {}
        self.groups: dict[str, GroupConfig] = {}
        #: The etcd revision the cache reflects (every change up to it is applied).
        self.revision = 0
        self._listeners: list[Listener] = []
        self._loaded = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._advanced = asyncio.Condition()

    # -- lifecycle ----------------------------------------------------------

    async def start(self) -> None:
        """Load everything once, then keep watching in a task."""
        await self._load()
        self._task = asyncio.create_task(self._run(), name="route-cache-watch")

    async def stop(self) -> None:
        task, self._task = self._task, None
        await cancel_and_wait(task)

    @property
    def loaded(self) -> bool:
        """True once the first full read from etcd succeeded."""
        return self._loaded.is_set()

    def add_listener(self, callback: Listener) -> None:
        """Call `callback(change)` after each change is applied (sync or async callable)."""
        self._listeners.append(callback)

    def remove_listener(self, callback: Listener) -> None:
        with contextlib.suppress(ValueError):
            self._listeners.remove(callback)

    async def wait_revision(self, revision: int, timeout_s: float = 5.0) -> bool:
        """Wait until the cache has applied `revision` (e.g. of our own write)."""
        async def reached() -> None:
            async with self._advanced:
                await self._advanced.wait_for(lambda: self.revision >= revision)
        try:
            await asyncio.wait_for(reached(), timeout_s)
            return True
        except TimeoutError:
            return False

    # -- loading and watching ----------------------------------------------

    def _prefix(self) -> bytes:
        return self.registry.prefix.encode()

    async def _load(self) -> None:
        got = await self.registry.client.get_prefix(self._prefix())
        brokers: dict[BrokerKey, BrokerInfo] = {}
        topics: dict[str, TopicConfig] = {}
        groups: dict[str, GroupConfig] = {}
        for kv in got:
            parsed = self._parse(kv.key, kv.value)
            if isinstance(parsed, BrokerInfo):
                brokers[parsed.key] = parsed
            elif isinstance(parsed, TopicConfig):
                topics[parsed.name] = parsed
            elif isinstance(parsed, GroupConfig):
                groups[parsed.name] = parsed
        changes = (_diff("broker", self.brokers, brokers) + _diff("topic", self.topics, topics)
                   + _diff("group", self.groups, groups))
        self.brokers, self.topics, self.groups = brokers, topics, groups
        await self._advance(got.header.revision)
        self._loaded.set()
        for change in changes:
            await self._notify(change)

    def _watch_from(self) -> tuple[bytes, int]:
        return self._prefix(), self.revision

    async def _apply_event(self, kind: str, key: bytes, value: bytes, revision: int) -> None:
        change: CacheChange | None
        if kind == "DELETE":
            change = self._remove(key)
        else:
            parsed = self._parse(key, value)
            change = None if parsed is None else self._store(parsed)
        await self._advance(revision)
        if change is not None:
            await self._notify(change)

    def _store(self, parsed: BrokerInfo | TopicConfig | GroupConfig) -> CacheChange:
        if isinstance(parsed, BrokerInfo):
            self.brokers[parsed.key] = parsed
            return CacheChange("broker", parsed.key, parsed)
        if isinstance(parsed, TopicConfig):
            self.topics[parsed.name] = parsed
            return CacheChange("topic", parsed.name, parsed)
        self.groups[parsed.name] = parsed
        return CacheChange("group", parsed.name, parsed)

    def _remove(self, key: bytes) -> CacheChange | None:
        parts = self._split(key)
        if parts is None:
            return None
        kind, rest = parts
        if kind == "brokers" and len(rest) == 3 and rest[2].isdigit():
            bkey = (rest[0], rest[1], int(rest[2]))
            if self.brokers.pop(bkey, None) is not None:
                return CacheChange("broker", bkey, None)
        elif kind == "topics" and len(rest) == 1:
            if self.topics.pop(rest[0], None) is not None:
                return CacheChange("topic", rest[0], None)
        elif kind == "groups" and len(rest) == 1:
            if self.groups.pop(rest[0], None) is not None:
                return CacheChange("group", rest[0], None)
        return None

    def _split(self, key: bytes) -> tuple[str, list[str]] | None:
        try:
            rel = key.decode()[len(self.registry.prefix):]
        except UnicodeDecodeError:
            return None
        kind, _, rest = rel.partition("/")
        return kind, rest.split("/")

    def _parse(self, key: bytes, value: bytes) -> BrokerInfo | TopicConfig | GroupConfig | None:
        """Parse one key; invalid values are logged and skipped, never fatal."""
        parts = self._split(key)
        if parts is None:
            return None
        kind, rest = parts
        try:
            if kind == "brokers" and len(rest) == 3:
                return BrokerInfo.from_json(value)
            if kind == "topics" and len(rest) == 1:
                return TopicConfig.from_json(value)
            if kind == "groups" and len(rest) == 1:
                return GroupConfig.from_json(value)
        except ValueError as exc:
            log.warning("ignoring invalid value at %s: %s", key.decode(errors="replace"), exc)
        return None

    async def _advance(self, revision: int) -> None:
        async with self._advanced:
            self.revision = max(self.revision, revision)
            self._advanced.notify_all()

    async def _notify(self, change: CacheChange) -> None:
        for callback in list(self._listeners):
            try:
                result = callback(change)
                if inspect.isawaitable(result):
                    await result
            except Exception:
                log.exception("route cache listener %r failed", callback)

    # -- queries ------------------------------------------------------------

    def masters(self) -> list[BrokerInfo]:
        return [b for b in self.brokers.values() if b.is_master]

    def route(self, topic: str) -> dict[str, Any] | None:
        """The namesrv route of `topic`, or None when the topic is unknown.

        A configured topic is served by its `brokers` list, or by every broker
        group when the list is empty. A topic with no config that brokers
        advertise (created on a broker) is routed to those brokers. Each
        broker group appears once, with its master's address (None while the
        master is down, so consumers can still read from slaves) and its
        slaves' addresses. A group named in the topic's `brokers` list stays in
        the route while none of its brokers is registered (no master, no
        slaves): ordered keys hash over the route's queues, and a key must not
        move to another broker's queue (overtaking what it sent before) just
        because its broker restarts.
        """
        cfg = self.topics.get(topic)
        groups: dict[tuple[str, str], list[BrokerInfo]] = {}
        for info in sorted(self.brokers.values(), key=lambda b: b.key):
            groups.setdefault((info.cluster, info.name), []).append(info)
        if cfg is not None:
            wanted = set(cfg.brokers)
            chosen = {k: v for k, v in groups.items() if not wanted or k[1] in wanted}
            listed = {name for _, name in chosen}
            for name in sorted(wanted - listed):   # configured, but down right now
                chosen[("", name)] = []
        else:
            chosen = {k: v for k, v in groups.items() if any(topic in b.topics for b in v)}
            if not chosen:
                return None
        entries = []
        for (cluster, name), members in sorted(chosen.items(), key=lambda kv: kv[0][1]):
            master = max((b for b in members if b.is_master), key=lambda b: b.epoch,
                         default=None)
            if cfg is not None:
                queues = cfg.queues
            else:
                queues = max(b.topics.get(topic, 0) for b in members)
            entries.append({
                "name": name, "cluster": cluster,
                "master": master.addr if master else None,
                "slaves": [b.addr for b in members if b is not master and not b.is_master],
                "epoch": master.epoch if master else max((b.epoch for b in members), default=0),
                "queues": queues, "perm": cfg.perm if cfg else "rw",
            })
        return {"topic": topic, "type": cfg.type if cfg else "normal",
                "perm": cfg.perm if cfg else "rw", "brokers": entries,
                "priority_levels": cfg.priority_levels if cfg else 1}


def _diff(kind: str, old: dict[Any, Any], new: dict[Any, Any]) -> list[CacheChange]:
    changes = [CacheChange(kind, k, v) for k, v in new.items() if old.get(k) != v]
    changes += [CacheChange(kind, k, None) for k in old if k not in new]
    return changes
