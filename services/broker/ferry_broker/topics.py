"""Which topics this broker serves, and with how many queues.

Topic config lives in etcd (`/ferry/topics/{topic}`) and reaches the broker
through the routing RegistryCache. A topic the cache does not know is created
here on first SEND when AUTO_CREATE_TOPICS is on (with DEFAULT_QUEUES queues),
and internal topics (`%RETRY%...`, `%DLQ%...`, `%SCHEDULE%`, `%SYS%...`) always
are, since only Ferry itself builds their names: `%SCHEDULE%` with
SCHEDULE_QUEUES queues, a group's retry and dead-letter topics with one
(RocketMQ's choice: a group's retries are few next to its topic's traffic). The app is told of every change so that
it can update the broker's etcd registration and record a created topic.

Creation is bounded (issue 24: every topic a broker serves lands in its one
etcd registration value): past MAX_TOPICS topics served (configured in etcd
and created here), or past MAX_TOPICS_PER_IDENTITY topics created here for
one identity (auth on: the access key of the request that named the topic),
a topic is not created and the request gets BusyError naming the limit.
Topics already served are never refused, and neither are the broker's own
fixed internal topics (`%SCHEDULE%`, `%HALF%`, `%OP%`, `%TRACE%`); a group's
`%RETRY%`/`%DLQ%` topics count like any other. The per-identity count is
kept in memory since the broker started: the per-broker limit is the one that
holds across restarts.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from ferry.errors import BusyError, NoPermissionError, TopicNotFoundError
from ferry.names import HALF_TOPIC, OP_TOPIC, SCHEDULE_TOPIC, TRACE_TOPIC, is_internal
from ferry.store import TopicRetention
from ferry.wire import Frame

from ferry_broker.config import BrokerConfig

if TYPE_CHECKING:
    from ferry.routing import GroupConfig, RegistryCache, TopicConfig

SCHEDULE_QUEUES = 4
#: Internal topics every broker has (created on first use, with fixed queue counts).
SYSTEM_TOPICS = frozenset({SCHEDULE_TOPIC, HALF_TOPIC, OP_TOPIC})
ChangeListener = Callable[[str | None], None]  # argument: the topic just created here, if any
#: Who asked for a request (auth on: its access key); "" when nobody is known.
IdentityOf = Callable[[Frame], str]
#: The broker's own topics: a handful, created whatever the limits say.
_OWN_TOPICS = SYSTEM_TOPICS | {TRACE_TOPIC}


class TopicManager:
    """Resolves a topic's queue count for SEND and lists the topics served."""

    def __init__(self, config: BrokerConfig, cache: RegistryCache | None,
                 identity_of: IdentityOf | None = None) -> None:
        self._config = config
        self._cache = cache
        self._identity_of = identity_of
        self._local: dict[str, int] = {}  # created here, not (yet) seen in etcd
        self._created_by: dict[str, int] = {}  # identity -> topics created here for it
        self._served_count: int | None = None  # len(served()), until the next change
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

    def retention(self) -> dict[str, TopicRetention] | None:
        """Per-topic retention for the store: the topics whose etcd config sets one.

        None until the topic config is loaded: a run then could not know which
        topics keep their records longer than the broker (housekeeping.py waits)."""
        if not self._loaded:
            return None
        if self._cache is None:
            return {}
        return {name: TopicRetention(cfg.retention_ms, cfg.retention_bytes)
                for name, cfg in self._cache.topics.items()
                if cfg.retention_ms is not None or cfg.retention_bytes is not None}

    def configured_group(self, group: str) -> GroupConfig | None:
        """The group's config from etcd, if the cache has it (the topic config's neighbour)."""
        return self._cache.groups.get(group) if self._cache is not None else None

    def _serves(self, cfg: TopicConfig) -> bool:
        return not cfg.brokers or self._config.name in cfg.brokers

    def queues_for_send(self, topic: str, request: Frame | None = None) -> int:
        """The queue count to accept a SEND with; raises when this broker must refuse it.

        `request` is the one that names the topic: a topic created for it counts
        against its identity's limit.
        """
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
        if topic not in _OWN_TOPICS:
            self._admit(topic, request)
        queues = self._local[topic] = internal_queues(topic, self._config.default_queues)
        self._served_count = None
        self._notify(topic)
        return queues

    def _admit(self, topic: str, request: Frame | None) -> None:
        """Count a topic about to be created here; BusyError past a limit (nothing counted)."""
        cfg = self._config
        if self._served_count is None:
            self._served_count = len(self.served())
        if self._served_count >= cfg.max_topics:
            raise BusyError(f"topic {topic} not created: broker {cfg.name} serves "
                            f"{self._served_count} topics, its limit (MAX_TOPICS)")
        identity = self._identity_of(request) if self._identity_of and request else ""
        if identity:
            created = self._created_by.get(identity, 0)
            if created >= cfg.max_topics_per_identity:
                raise BusyError(f"topic {topic} not created: {identity!r} has created "
                                f"{created} topics on broker {cfg.name}, its limit "
                                f"(MAX_TOPICS_PER_IDENTITY)")
            self._created_by[identity] = created + 1

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
        self._served_count = None
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
