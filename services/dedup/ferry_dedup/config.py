"""The dedup service's configuration: one frozen value built from FERRY_DEDUP_* variables.

`DedupConfig.from_env()` reads the environment; command-line flags (see
`__main__`) arrive as `overrides` and win. Every limit the service enforces is
a field here (the table is in docs/idempotence.md, "The dedup service").
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ferry.idempotence import validate_scene
from ferry.names import validate_group, validate_topic
from ferry.service.config import MeshServiceConfig, check_service
from ferry.wire import MAX_PULL_COUNT  # a broker answers PULL with at most this many records

ENV_PREFIX = "FERRY_DEDUP_"
SQLITE_URL_PREFIX = "sqlite:///"
POSTGRES_URL_PREFIXES = ("postgresql://", "postgres://")
MAX_REPORTS_LIMIT = 10_000
MAX_SAMPLE_LIMIT = 1000
# Fields that may be 0 (no grace, no margin).
_MAY_BE_ZERO = frozenset({"grace_ms", "clock_skew_ms", "margin_ms"})


@dataclass(frozen=True, slots=True)
class ReconcileTarget:
    """One scheduled reconciliation: a topic, a group and the ledger scene (default: the group)."""

    topic: str
    group: str
    scene: str

    @classmethod
    def parse_list(cls, spec: str) -> tuple[ReconcileTarget, ...]:
        """`"orders:billing,orders:shipping:ship"` -> targets; ValueError naming a bad item."""
        out = []
        for item in (i.strip() for i in spec.split(",")):
            if not item:
                continue
            parts = item.split(":")
            if len(parts) not in (2, 3):
                raise ValueError(f"reconcile target {item!r} is not topic:group[:scene]")
            try:
                topic, group = validate_topic(parts[0]), validate_group(parts[1])
                scene = validate_scene(parts[2] if len(parts) == 3 else group)
            except Exception as exc:  # InvalidNameError / FerryError: say which item
                raise ValueError(f"reconcile target {item!r}: {exc}") from None
            out.append(cls(topic, group, scene))
        return tuple(out)


@dataclass(frozen=True)
class DedupConfig(MeshServiceConfig):
    """Everything the dedup service needs to start; defaults run on one machine."""

    ENV_PREFIX = ENV_PREFIX

    http_port: int = 10926
    data_dir: str = "./var/dedup"
    redis: str = "redis://127.0.0.1:6379/0"
    # sqlite:///PATH or postgresql://user@host:port/db; empty = sqlite:///<data_dir>/ledger.db
    ledger_url: str = ""
    ledger_table: str = "ferry_ledger"
    # Claims over HTTP (the Redis weak check): the default lease and "done" TTL.
    claim_lease_ms: int = 30_000
    claim_done_ttl_ms: int = 7 * 24 * 3_600_000
    # Scheduled reconciliation: "topic:group[:scene],..." every interval, over the
    # last `reconcile_window_ms` (longer than interval + grace, so that every message
    # is judged at least once after its grace period).
    reconcile: str = ""
    reconcile_interval_s: int = 300
    reconcile_window_ms: int = 3_600_000
    # Judging one window: a stored message younger than grace_ms is "pending", not
    # missing; ledger rows are read from clock_skew_ms before the window to margin_ms
    # after it, and stored messages from margin_ms before it (a message stored at t
    # is recorded after t: consumer lag).
    grace_ms: int = 60_000
    clock_skew_ms: int = 5_000
    margin_ms: int = 600_000
    max_window_ms: int = 7 * 24 * 3_600_000
    max_scan_messages: int = 2_000_000   # stored messages read per reconciliation
    max_orphan_checks: int = 1000        # ledger rows verified by QUERY_BY_ID per run
    sample_limit: int = 100              # ids listed per report section
    max_reports: int = 100               # reports kept in data_dir/reports (newest)
    pull_max_count: int = 1024
    request_timeout_ms: int = 10_000
    db_timeout_ms: int = 5_000           # connecting to / locking the ledger database
    # Where identities live when auth is on (FERRY_AUTH=on); unused otherwise.
    etcd: str = ""

    def __post_init__(self) -> None:
        check_service(self, ENV_PREFIX, _MAY_BE_ZERO)
        if self.pull_max_count > MAX_PULL_COUNT:
            raise ValueError(f"pull_max_count cannot exceed the broker's {MAX_PULL_COUNT}")
        if self.max_reports > MAX_REPORTS_LIMIT or self.sample_limit > MAX_SAMPLE_LIMIT:
            raise ValueError(f"max_reports is at most {MAX_REPORTS_LIMIT} and sample_limit "
                             f"at most {MAX_SAMPLE_LIMIT}")
        if self.reconcile_window_ms < self.reconcile_interval_s * 1000 + self.grace_ms:
            raise ValueError("reconcile_window_ms must be at least reconcile_interval_s "
                             "* 1000 + grace_ms, or some messages are never judged")
        if self.reconcile_window_ms > self.max_window_ms:
            raise ValueError("reconcile_window_ms cannot exceed max_window_ms")
        url = self.ledger_url
        if url and not url.startswith((SQLITE_URL_PREFIX, *POSTGRES_URL_PREFIXES)):
            raise ValueError(f"ledger_url {url!r}: use sqlite:///PATH or postgresql://...")
        ReconcileTarget.parse_list(self.reconcile)

    @property
    def data_path(self) -> Path:
        return Path(self.data_dir)

    @property
    def ledger(self) -> str:
        """The ledger database URL (the SQLite default under data_dir when none is set)."""
        return self.ledger_url or f"{SQLITE_URL_PREFIX}{self.data_path / 'ledger.db'}"

    @property
    def targets(self) -> tuple[ReconcileTarget, ...]:
        return ReconcileTarget.parse_list(self.reconcile)
