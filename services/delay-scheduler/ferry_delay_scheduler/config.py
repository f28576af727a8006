"""The scheduler's configuration: one frozen value built from FERRY_DELAY_SCHEDULER_* variables.

`SchedulerConfig.from_env()` reads the environment; command-line flags (see
`__main__`) arrive as `overrides` and win. Every limit the scheduler enforces
is a field here (the table is in docs/delay.md).
"""
from __future__ import annotations

import dataclasses
import socket
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ferry import settings
from ferry.auth.credentials import auth_enabled
from ferry.wire import MAX_PULL_COUNT  # a broker answers PULL with at most this many records

ENV_PREFIX = "FERRY_DELAY_SCHEDULER_"
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
MAX_DELIVER_BATCH_MESSAGES = 10_000  # a broker refuses a larger SEND / DELIVER_DUE batch
MIN_SEGMENT_BYTES = 8 << 20  # the local log's segments must hold one largest record
MAX_DELAY_MS = 30 * 24 * 3_600_000  # the broker's default maximum delay (30 days)
# Fields that may be 0 (an int that is "off" or a port chosen by the OS).
_MAY_BE_ZERO = frozenset({"http_port"})


@dataclass(frozen=True)
class SchedulerConfig:
    """Everything the delay scheduler needs to start; defaults run on one machine."""

    host: str = "127.0.0.1"
    # The host other instances and clients are told to use (leader record, 503 bodies).
    advertise_host: str = ""
    http_port: int = 10922
    data_dir: str = "./var/delay-scheduler"
    namesrv: str = "127.0.0.1:9876"
    etcd: str = "127.0.0.1:2379"  # empty = no election: this instance always leads
    etcd_prefix: str = "/ferry/"
    instance_id: str = ""  # empty = host name + a random suffix
    log_level: str = "INFO"
    # Leadership: the lease TTL bounds how long a dead leader blocks a standby.
    leader_ttl_s: int = 10
    # The timing wheel: one bucket file per `bucket_ms` of due time; buckets due
    # within `window_ms` are held in memory.
    bucket_ms: int = 60_000
    window_ms: int = 60_000
    # The local log store (its own commit log, consume queue and index).
    segment_bytes: int = 64 << 20
    # Longer than the longest delay, so that a pending message's record is never
    # expired by age (and the disk watermark is off: see docs/delay.md).
    retention_hours: float = 31 * 24.0
    journal_retention_hours: float = 72.0
    flush_interval_ms: int = 200
    progress_interval_ms: int = 1000
    # Pulling %SCHEDULE% from the brokers.
    route_poll_ms: int = 2000
    pull_max_count: int = 1024  # the broker's PULL limit (docs/broker.md)
    pull_max_wait_ms: int = 1000
    # Delivering due messages.
    deliver_batch_messages: int = 10_000
    deliver_batch_bytes: int = 1 << 20
    deliver_inflight_frames: int = 8
    deliver_timeout_ms: int = 10_000
    retry_backoff_ms: int = 1000
    # A cancel that finds nothing waits this long for the pull loop to catch up.
    cancel_wait_ms: int = 2000
    shutdown_timeout_ms: int = 10_000
    # Failover (docs/delay.md): a pending record taken this long ago, and not due
    # within the window, is stored again in %SCHEDULE% so that the committed
    # low-water mark moves on (what a new leader must read again is bounded by it).
    roll_after_ms: int = 600_000
    # FERRY_AUTH=on (the one switch every service reads): every route but /healthz,
    # /readyz and /openapi.json needs a signed request with its permission; the
    # identities come from etcd.
    auth: bool = False

    def __post_init__(self) -> None:
        if self.auth and not self.etcd:
            raise ValueError("FERRY_AUTH=on needs FERRY_DELAY_SCHEDULER_ETCD: identities and "
                             "their rules live in etcd")
        if self.log_level.upper() not in LOG_LEVELS:
            raise ValueError(f"log_level must be one of {', '.join(LOG_LEVELS)}")
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.type in ("int", "float") and f.name not in _MAY_BE_ZERO and value <= 0:
                raise ValueError(f"{f.name} must be positive, not {value}")
        if not 0 <= self.http_port < 65536:
            raise ValueError(f"http_port must be in 0..65535, not {self.http_port}")
        if self.retention_hours * 3_600_000 <= MAX_DELAY_MS:
            raise ValueError("retention_hours must exceed the 30-day maximum delay "
                             "(a pending message's record must outlive its delay)")
        if self.leader_ttl_s < 2:
            raise ValueError("leader_ttl_s must be at least 2")
        if self.etcd_prefix and not self.etcd_prefix.endswith("/"):
            raise ValueError("etcd_prefix must end with '/'")
        if self.segment_bytes < MIN_SEGMENT_BYTES:
            raise ValueError(f"segment_bytes must be at least {MIN_SEGMENT_BYTES} "
                             "(a segment holds at least one 4 MiB message)")
        if self.pull_max_count > MAX_PULL_COUNT:
            raise ValueError(f"pull_max_count cannot exceed the broker's {MAX_PULL_COUNT}")
        if self.deliver_batch_messages > MAX_DELIVER_BATCH_MESSAGES:
            raise ValueError(f"deliver_batch_messages cannot exceed the broker's "
                             f"{MAX_DELIVER_BATCH_MESSAGES}")
        if self.deliver_batch_bytes > 8 << 20:
            raise ValueError("deliver_batch_bytes must stay well under the 16 MiB frame limit")

    @property
    def data_path(self) -> Path:
        return Path(self.data_dir)

    @property
    def node_id(self) -> str:
        return self.instance_id or f"{socket.gethostname()}-{uuid.uuid4().hex[:8]}"

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None,
                 overrides: Mapping[str, Any] | None = None) -> SchedulerConfig:
        """Build from FERRY_DELAY_SCHEDULER_<FIELD> variables; `overrides` (non-None) win."""
        return settings.from_env(cls, ENV_PREFIX, env,
                                 {"auth": auth_enabled(env), **(overrides or {})})
