"""The txn-checker's configuration: one frozen value built from FERRY_TXN_CHECKER_* variables.

`CheckerConfig.from_env()` reads the environment; command-line flags (see
`__main__`) arrive as `overrides` and win. Every limit the checker enforces
is a field here (the table is in docs/transactions.md, "The txn-checker").
"""
from __future__ import annotations

from dataclasses import dataclass

from ferry.routing.election import MIN_TTL_S
from ferry.service.config import InstanceConfig, check_service
from ferry.wire import MAX_PULL_COUNT  # a broker answers PULL with at most this many records

ENV_PREFIX = "FERRY_TXN_CHECKER_"
MAX_CHECKS_LIMIT = 1000  # a higher max_checks would keep a half open for days
# Fields that may be 0 (no immunity).
_MAY_BE_ZERO = frozenset({"check_immunity_ms"})


@dataclass(frozen=True)
class CheckerConfig(InstanceConfig):
    """Everything the txn-checker needs to start; defaults run on one machine."""

    ENV_PREFIX = ENV_PREFIX

    http_port: int = 10923
    data_dir: str = "./var/txn-checker"
    # -- Leadership (docs/transactions.md, "Leadership and failover"): every instance
    # runs the election in etcd (`etcd`, also where identities live when auth is on);
    # only the leader scans and checks. Empty etcd: no election, this one instance leads.
    # The leader's lease: it stops acting 2/3 of this after its last refresh; a standby
    # takes over at most about this long after the leader's machine is lost.
    leader_ttl_s: int = 6
    # -- end of leadership settings
    # The check schedule: a half with no op is first checked `check_immunity_ms` after
    # its store time (its CHECK_IMMUNITY_MS property wins), then every
    # `check_interval_ms`; `check_interval_ms` after the `max_checks`-th check it is
    # rolled back and listed as discarded.
    check_immunity_ms: int = 6000
    check_interval_ms: int = 60_000
    max_checks: int = 15
    check_concurrency: int = 64  # CHECK / END requests in flight at once
    check_timeout_ms: int = 5000
    retry_backoff_ms: int = 2000  # after a check the broker could not take
    # Bounds on memory: at most `max_open` open halves are held (the %HALF% scan
    # pauses beyond it, with a warning); the discarded list keeps the newest
    # `max_discarded` entries.
    max_open: int = 1_000_000
    max_discarded: int = 10_000
    max_recent: int = 10_000  # recently resolved transactions kept for describe
    # Scanning %HALF% and %OP% on the brokers.
    route_poll_ms: int = 2000
    pull_max_count: int = 1024
    pull_max_wait_ms: int = 1000
    checkpoint_interval_ms: int = 1000
    shutdown_timeout_ms: int = 10_000

    def __post_init__(self) -> None:
        check_service(self, ENV_PREFIX, _MAY_BE_ZERO)
        if self.pull_max_count > MAX_PULL_COUNT:
            raise ValueError(f"pull_max_count cannot exceed the broker's {MAX_PULL_COUNT}")
        if self.leader_ttl_s < MIN_TTL_S:
            raise ValueError(f"leader_ttl_s must be at least {MIN_TTL_S} (etcd's shortest lease)")
        if self.max_checks > MAX_CHECKS_LIMIT:
            raise ValueError(f"max_checks cannot exceed {MAX_CHECKS_LIMIT}")
