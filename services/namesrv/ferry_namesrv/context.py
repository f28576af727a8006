"""What every request handler reaches through the aiohttp app: config, registry, cache."""
from __future__ import annotations

from dataclasses import dataclass, field

from aiohttp import web
from ferry.errors import BusyError
from ferry.routing import EtcdRegistry, RegistryCache

from ferry_namesrv.config import NamesrvConfig
from ferry_namesrv.topic_quota import TopicQuota


@dataclass(frozen=True)
class NamesrvContext:
    """The components the handlers share; the cache answers reads, the registry writes."""

    config: NamesrvConfig
    registry: EtcdRegistry
    cache: RegistryCache
    quota: TopicQuota = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "quota", TopicQuota(self.config.max_topics,
                                                     self.config.max_topics_per_identity))

    def ready_cache(self) -> RegistryCache:
        """The cache, or BusyError (503) while it has not loaded from etcd yet."""
        if not self.cache.loaded:
            raise BusyError("namesrv has not loaded its routes from etcd yet")
        return self.cache


CONTEXT = web.AppKey("namesrv_context", NamesrvContext)


def ctx(request: web.Request) -> NamesrvContext:
    return request.app[CONTEXT]
