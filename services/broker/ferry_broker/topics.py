"""Which topics this broker serves, and with how many queues.

Topic config lives in etcd (`/ferry/topics/{topic}`) and reaches the broker
through the routing RegistryCache. A topic the cache does not know is created
here on first SEND when AUTO_CREATE_TOPICS is on (with DEFAULT_QUEUES queues),
and internal topics (`%RETRY%...`, `%DLQ%...`, `%SCHEDULE%`, `%SYS%...`) always
are, since only Ferry itself builds their names: `%SCHEDULE%` with
SCHEDULE_QUEUES queues, a group's retry and dead-letter topics with one
(RocketMQ's choice: a group's retries are few next to its topic's traffic). The app is told of every change so that
it can update the broker's etcd registration and record a created topic.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from ferry.errors import BusyError, NoPermissionError, TopicNotFoundError
from ferry.names import HALF_TOPIC, OP_TOPIC, SCHEDULE_TOPIC, is_internal

from ferry_broker.config import BrokerConfig

if TYPE_CHECKING:
    from ferry.routing import GroupConfig, RegistryCache, TopicConfig

SCHEDULE_QUEUES = 4
#: Internal topics every broker has (created on first use, with fixed queue counts).
SYSTEM_TOPICS = frozenset({SCHEDULE_TOPIC, HALF_TOPIC, OP_TOPIC})
ChangeListener = Callable[[str | None], None]  # argument: the topic just created here, if any


class TopicManager:
    """Resolves a topic's queue count for SEND and lists the topics served."""

    def __init__(self, config: BrokerConfig, cache: RegistryCache | None) -> None:
        self._config = config
        self._cache = cache
        self._local: dict[str, int] = {}  # created here, not (yet) seen in etcd
        self._listeners: list[ChangeListener] = []
        # Until etcd's topic config is loaded, an unknown topic may well be configured
        # there: refuse (retriable) rather than create it with the default queue count.
        self._loaded = cache is None

    def mark_loaded(self) -> None:
        """Topic config has been loaded from etcd."""
        self._loaded = True

    def add_listener(self, listener: ChangeListener) -> None:
        self._listeners.append(listener)

    def configured(self, topic: str) -> TopicConfig | None:
        """The topic's config from etcd, if the cache has it."""
        return self._cache.topics.get(topic) if self._cache is not None else None

    def type_of(self, topic: str) -> str:
        """The topic's `type` (topic_types.py); "normal" for a topic etcd does not configure."""
        cfg = self.configured(topic)
        return cfg.type if cfg is not None else "normal"

    def configured_group(self, group: str) -> GroupConfig | None:
        """The group's config from etcd, if the cache has it (the topic config's neighbour)."""
        return self._cache.groups.get(group) if self._cache is not None else None

    def _serves(self, cfg: TopicConfig) -> bool:
        return not cfg.brokers or self._config.name in cfg.brokers

    def queues_for_send(self, topic: str) -> int:
        """The queue count to accept a SEND with; raises when this broker must refuse it."""
        cfg = self.configured(topic)
        if cfg is not None:
            if not self._serves(cfg):
                raise NoPermissionError(f"broker {self._config.name} does not serve topic {topic}")
            if "w" not in cfg.perm:
                raise NoPermissionError(f"topic {topic} is not writable (perm {cfg.perm})")
            return cfg.queues
        queues = self._local.get(topic)
        if queues is not None:
            return queues
        if not self._loaded:
            raise BusyError(f"topic config not loaded from etcd yet; cannot place {topic}")
        if not (self._config.auto_create_topics or is_internal(topic)):
            raise TopicNotFoundError(f"topic {topic} does not exist and auto-creation is off")
        queues = self._local[topic] = internal_queues(topic, self._config.default_queues)
        self._notify(topic)
        return queues

    def queue_count(self, topic: str) -> int:
        """How many queues `topic` has on this broker by its config (0: none here): etcd's
        config when this broker serves it, else created here, else a system topic's fixed
        count, else as a live member of this broker's group registered it (a slave's view
        of a topic its master created). (Queues the store holds exist too: the caller
        asks the store.)"""
        cfg = self.configured(topic)
        if cfg is not None:
            return cfg.queues if self._serves(cfg) else 0
        if topic in SYSTEM_TOPICS:
            return internal_queues(topic, self._config.default_queues)
        local = self._local.get(topic)
        if local is not None or self._cache is None:
            return local or 0
        me = (self._config.cluster, self._config.name)
        return max((info.topics.get(topic, 0) for key, info in self._cache.brokers.items()
                    if key[:2] == me), default=0)

    def check_readable(self, topic: str) -> None:
        """Refuse a PULL on a topic that is configured but not readable here."""
        cfg = self.configured(topic)
        if cfg is not None and "r" not in cfg.perm:
            raise NoPermissionError(f"topic {topic} is not readable (perm {cfg.perm})")

    def served(self) -> dict[str, int]:
        """Topic -> queue count for the etcd registration."""
        known = self._cache.topics if self._cache is not None else {}
        out = {t: q for t, q in self._local.items() if t not in known}
        for name, cfg in known.items():
            if self._serves(cfg):
                out[name] = cfg.queues
        return dict(sorted(out.items()))

    def config_changed(self, *_: object) -> None:
        """Called by the RegistryCache after each change in etcd."""
        self._notify(None)

    def _notify(self, created: str | None) -> None:
        for listener in self._listeners:
            listener(created)


def internal_queues(topic: str, default_queues: int) -> int:
    """How many queues a topic gets when this broker creates it."""
    if topic == SCHEDULE_TOPIC:
        return SCHEDULE_QUEUES
    if is_internal(topic):
        return 1
    return default_queues
