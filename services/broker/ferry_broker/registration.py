"""The broker's presence in etcd: its lease-bound key, and topic config it follows.

The broker key `/ferry/brokers/{cluster}/{name}/{id}` carries the topics the
broker serves ({topic: queues}), its replication address and its role and
epoch in its group (roles.py: re-registered on every change); it lives under a lease (LEASE_TTL_S, kept
alive by ferry.routing), so it disappears when the process dies. Changes in
topic config (seen by the RegistryCache) or a topic created here on first SEND
lead to an update of the key, debounced. A topic created here is also written
to `/ferry/topics/` (create-only) so that namesrv routes it.
With ETCD empty, the broker runs alone: no key, no topic config.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging

from ferry.routing import BrokerInfo, EtcdRegistry, RegistryCache, TopicConfig

from ferry_broker.config import BrokerConfig
from ferry_broker.topics import TopicManager, internal_queues

log = logging.getLogger(__name__)

UPDATE_DEBOUNCE_S = 0.2
RETRY_FIRST_S = 0.2
RETRY_MAX_S = 5.0


class Registration:
    """Registry, route cache and the broker key, for the app to start and stop."""

    def __init__(self, config: BrokerConfig) -> None:
        self._config = config
        self.registry: EtcdRegistry | None = None
        self.cache: RegistryCache | None = None
        self._topics: TopicManager | None = None
        self._registered: dict[str, int] | None = None
        self._changed = asyncio.Event()
        self._created: list[str] = []
        self._task: asyncio.Task[None] | None = None
        # The broker's role in its group (roles.py); "" = not replicating.
        self._role, self._epoch = ("" if config.replication == "none" else "slave"), 0
        self._registered_role: tuple[str, int] | None = None

    def prepare(self) -> RegistryCache | None:
        """The route cache to follow topic config with (empty until `connect`); None without etcd."""
        if not self._config.etcd:
            log.warning("FERRY_BROKER_ETCD is empty: running without etcd")
            return None
        self.registry = EtcdRegistry(self._config.etcd, prefix=self._config.etcd_prefix)
        self.cache = RegistryCache(self.registry)
        return self.cache

    async def connect(self, topics: TopicManager) -> None:
        """Connect, load topic config and register, retrying with back-off until etcd answers.

        Runs in the background while the broker already serves, so that start
        order (etcd after the broker) does not matter; the app is ready after it.
        """
        if self.registry is None or self.cache is None:
            await self.register(topics)
            return
        backoff_s, connected, loaded = RETRY_FIRST_S, False, False
        while True:
            try:
                if not connected:
                    await self.registry.start()
                    connected = True
                if not loaded:
                    await self.cache.start()
                    loaded = True
                    topics.mark_loaded()
                await self.register(topics)
                return
            except Exception as exc:  # aetcd and socket errors alike: etcd is not there yet
                log.warning("etcd not reachable yet (%s: %s); retrying in %.1fs",
                            type(exc).__name__, exc, backoff_s)
                await asyncio.sleep(backoff_s)
                backoff_s = min(backoff_s * 2, RETRY_MAX_S)

    def _info(self, topics: dict[str, int]) -> BrokerInfo:
        cfg = self._config
        return BrokerInfo(cluster=cfg.cluster, name=cfg.name, broker_id=cfg.id, addr=cfg.addr,
                          repl_addr=cfg.repl_addr, http_addr=cfg.http_addr, topics=topics,
                          role=self._role, epoch=self._epoch)

    def set_role(self, role: str, epoch: int) -> None:
        """Register `role` and `epoch` from now on (the key is updated in the background)."""
        if (role, epoch) != (self._role, self._epoch):
            self._role, self._epoch = role, epoch
            self._changed.set()

    async def register(self, topics: TopicManager) -> None:
        """Put the broker key under a lease and follow topic changes from now on."""
        self._topics = topics
        if self.registry is None:
            return
        served = topics.served()
        ttl_s = self._config.lease_ttl_s
        await self.registry.register_broker(self._info(served), ttl_s=ttl_s,
                                            keepalive_s=ttl_s / 3)
        self._registered = served
        self._registered_role = (self._role, self._epoch)
        topics.add_listener(self._on_change)
        if self.cache is not None:
            self.cache.add_listener(topics.config_changed)
        self._task = asyncio.get_running_loop().create_task(self._update_loop())
        log.info("registered in etcd with %d topics", len(served))

    def _on_change(self, created: str | None) -> None:
        if created is not None:
            self._created.append(created)
        self._changed.set()

    async def _update_loop(self) -> None:
        assert self.registry is not None and self._topics is not None
        while True:
            await self._changed.wait()
            await asyncio.sleep(UPDATE_DEBOUNCE_S)
            self._changed.clear()
            created, self._created = self._created, []
            for topic in created:
                await self._create_topic(topic)
            served = self._topics.served()
            role = (self._role, self._epoch)
            if served != self._registered or role != self._registered_role:
                try:
                    await self.registry.update_broker(self._info(served))
                    self._registered, self._registered_role = served, role
                except Exception as exc:  # aetcd raises its own types; keep following
                    log.warning("could not update the broker key: %s; retrying", exc)
                    self._changed.set()
                    await asyncio.sleep(1.0)

    async def _create_topic(self, topic: str) -> None:
        assert self.registry is not None
        try:
            cfg = TopicConfig(name=topic,
                              queues=internal_queues(topic, self._config.default_queues))
            await self.registry.put_topic(cfg, create_only=True)
            log.info("created topic %s (%d queues) on first use", topic, cfg.queues)
        except Exception as exc:  # already there (AlreadyExistsError), or etcd is away
            log.info("topic %s not recorded in etcd: %s", topic, exc)

    async def unregister(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self.registry is not None and self._registered is not None:
            try:
                await self.registry.unregister_broker()
            except Exception as exc:  # etcd away: the lease expires on its own
                log.warning("could not remove the broker key (its lease will expire): %s", exc)
            self._registered = None

    async def stop(self) -> None:
        if self.cache is not None:
            with contextlib.suppress(Exception):
                await self.cache.stop()
        if self.registry is not None:
            with contextlib.suppress(Exception):
                await self.registry.stop()
