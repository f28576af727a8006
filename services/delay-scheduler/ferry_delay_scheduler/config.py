"""The scheduler's configuration: one frozen value built from FERRY_DELAY_SCHEDULER_* variables.

`SchedulerConfig.from_env()` reads the environment; command-line flags (see
`__main__`) arrive as `overrides` and win. Every limit the scheduler enforces
is a field here (the table is in docs/delay.md).
"""
from __future__ import annotations

from dataclasses import dataclass

from ferry.service.config import InstanceConfig, check_service
from ferry.wire import MAX_PULL_COUNT  # a broker answers PULL with at most this many records

ENV_PREFIX = "FERRY_DELAY_SCHEDULER_"
MAX_DELIVER_BATCH_MESSAGES = 10_000  # a broker refuses a larger SEND / DELIVER_DUE batch
MIN_SEGMENT_BYTES = 8 << 20  # the local log's segments must hold one largest record
MAX_DELAY_MS = 30 * 24 * 3_600_000  # the broker's default maximum delay (30 days)


@dataclass(frozen=True)
class SchedulerConfig(InstanceConfig):
    """Everything the delay scheduler needs to start; defaults run on one machine."""

    ENV_PREFIX = ENV_PREFIX

    # The host other instances and clients are told to use (leader record, 503 bodies).
    advertise_host: str = ""
    http_port: int = 10922
    data_dir: str = "./var/delay-scheduler"
    etcd: str = "127.0.0.1:2379"  # empty = no election: this instance always leads
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

    def __post_init__(self) -> None:
        check_service(self, ENV_PREFIX)
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
