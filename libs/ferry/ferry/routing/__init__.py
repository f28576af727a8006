"""ferry.routing: broker registration and topic/group config in etcd, and a watched cache.

`EtcdRegistry` writes (broker leases kept alive, topic and group configs);
`RegistryCache` keeps an in-memory copy current through an etcd watch and builds
the route JSON that namesrv serves. Key layout: docs/internals.md.
"""
from __future__ import annotations

from ferry.routing.cache import CacheChange, RegistryCache
from ferry.routing.models import (
    DEFAULT_QUEUES,
    MAX_QUEUES,
    MIN_QUEUES,
    BrokerInfo,
    GroupConfig,
    InvalidConfigError,
    TopicConfig,
    validate_broker_name,
)
from ferry.routing.registry import (
    DEFAULT_PREFIX,
    EtcdRegistry,
    EtcdUnavailable,
    parse_endpoints,
    retry_etcd,
)

__all__ = [
    # registry
    "EtcdRegistry", "parse_endpoints", "retry_etcd", "EtcdUnavailable", "DEFAULT_PREFIX",
    # cache
    "RegistryCache", "CacheChange",
    # values
    "BrokerInfo", "TopicConfig", "GroupConfig", "InvalidConfigError", "validate_broker_name",
    "DEFAULT_QUEUES", "MIN_QUEUES", "MAX_QUEUES",
]
