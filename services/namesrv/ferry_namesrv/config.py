"""The name server's configuration: FERRY_NAMESRV_* environment variables, then flags.

Defaults run on one machine next to a local etcd. A bad value stops startup
with a message naming the variable, never a traceback.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from ferry.routing import MAX_QUEUES, MIN_QUEUES, parse_endpoints
from ferry.service.config import ServiceConfig, check_service

ENV_PREFIX = "FERRY_NAMESRV_"


class ConfigError(ValueError):
    """A configuration value is invalid; the message names the setting."""


@dataclass(frozen=True)
class NamesrvConfig(ServiceConfig):
    """Everything the name server needs to start (see docs/namesrv.md for the table)."""

    ENV_PREFIX = ENV_PREFIX
    config_error = ConfigError

    port: int = 9876
    etcd: str = "127.0.0.1:2379"
    etcd_prefix: str = "/ferry/"
    auto_create_topics: bool = True
    default_queues: int = 8
    # Topics created on first use stop here (topic_quota.py): etcd and every broker hold them.
    max_topics: int = 10_000              # topics in etcd in all
    max_topics_per_identity: int = 1_000  # created on first use for one identity (auth on)
    # Where `GET /console` sends a browser: the console is a service of its own
    # (ferry-console); namesrv only points at it.
    console_url: str = "http://127.0.0.1:10927/console"

    def __post_init__(self) -> None:
        check_service(self, ENV_PREFIX, port_field="port", error=ConfigError)
        try:
            parse_endpoints(self.etcd)
        except ValueError as exc:
            raise ConfigError(f"etcd: {exc}") from None
        if not self.etcd_prefix.startswith("/") or not self.etcd_prefix.endswith("/"):
            raise ConfigError(f"etcd_prefix must start and end with '/', got {self.etcd_prefix!r}")
        if not MIN_QUEUES <= self.default_queues <= MAX_QUEUES:
            raise ConfigError(f"default_queues must be in {MIN_QUEUES}..{MAX_QUEUES}, "
                              f"got {self.default_queues}")
        if self.max_topics < 1 or self.max_topics_per_identity < 1:
            raise ConfigError("max_topics and max_topics_per_identity must be at least 1")
        if not self.console_url.startswith(("http://", "https://")):
            raise ConfigError(f"console_url must be an http(s) URL, got {self.console_url!r}")

    def with_overrides(self, **overrides: Any) -> NamesrvConfig:
        """A copy with the given fields replaced (None means "not given")."""
        return replace(self, **{k: v for k, v in overrides.items() if v is not None})

