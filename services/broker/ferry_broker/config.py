"""The broker's configuration: one frozen value built from FERRY_BROKER_* variables.

`BrokerConfig.from_env()` reads the environment; command-line flags (see
`__main__`) arrive as `overrides` and win over the environment. Every limit the
broker enforces is a field here so that operators can see and change it.
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ferry.auth.credentials import auth_enabled
from ferry.service.config import check_service, from_env
from ferry.wire.codes import MAX_FRAME_BYTES

ENV_PREFIX = "FERRY_BROKER_"
FLUSH_MODES = ("async", "sync")
#: "none": a single broker with no election and no replication port (as before
#: issue 9); "async"/"sync": a broker group member elected through etcd
#: (docs/replication.md), sync masters acknowledge once a slave has the records.
REPLICATION_MODES = ("none", "async", "sync")


@dataclass(frozen=True)
class BrokerConfig:
    """Everything the broker needs to start; defaults run on one machine."""

    cluster: str = "DefaultCluster"
    name: str = "broker-a"
    id: int = 0
    host: str = "127.0.0.1"
    # The host clients are told to dial; empty means `host` (set it when binding 0.0.0.0).
    advertise_host: str = ""
    port: int = 10911
    http_port: int = 10920  # 0 = no HTTP API
    data_dir: str = "./var/broker-a"
    etcd: str = "127.0.0.1:2379"  # empty = run without etcd (no registration, no topic config)
    etcd_prefix: str = "/ferry/"
    lease_ttl_s: int = 30
    flush_mode: str = "async"
    flush_timeout_ms: int = 5000
    auto_create_topics: bool = True
    default_queues: int = 8
    # Topics created on first use stop here (topics.py): one etcd value lists them all.
    max_topics: int = 10_000              # served by this broker, configured or created
    max_topics_per_identity: int = 1_000  # created by this broker for one identity (auth on)
    segment_bytes: int = 1 << 30
    flush_interval_ms: int = 500  # async mode: how often the page cache is fdatasynced
    checkpoint_interval_ms: int = 1000
    max_message_bytes: int = 4 << 20
    retention_hours: float = 72.0
    retention_check_interval_ms: int = 10_000
    # -- disk pressure (issue 23; disk.py, docs/operations.md#disk-pressure) --
    # Ratios are used fractions of the data directory's filesystem. From
    # disk_retention_ratio on, retention deletes the oldest segments that every reader
    # (group offsets, connected slaves) has passed, even if not expired. At the
    # high-water mark writes are refused with DiskFullError (the alarm) until usage is
    # below the low-water mark.
    disk_retention_ratio: float = 0.75
    disk_high_water_ratio: float = 0.90
    disk_low_water_ratio: float = 0.85
    disk_check_interval_ms: int = 1000
    # Opt-in, the old rule: from disk_retention_ratio on the oldest segments go whatever
    # was read.
    disk_force_delete: bool = False
    # -- end of disk pressure --
    log_level: str = "INFO"
    consumer_expiry_ms: int = 30_000
    offsets_flush_interval_ms: int = 5000
    # The committed-offset table's bounds (issue 24, consumer_offsets.py): entries in all,
    # and (auth on) entries the commits of one identity may create.
    offsets_max_entries: int = 1_000_000
    offsets_max_per_identity: int = 100_000
    max_pull_wait_ms: int = 15_000
    max_held_pulls_per_conn: int = 256
    max_held_pulls: int = 10_000
    max_inflight_per_conn: int = 1024
    # Responses made but not yet written to a connection's socket; past it no further
    # request of that connection starts until the peer reads.
    max_unwritten_bytes_per_conn: int = 32 << 20
    max_connections: int = 10_000
    # One client address (a host, or a NAT in front of many) cannot take every connection.
    max_connections_per_addr: int = 1000
    # The largest frame taken from a client (at most the protocol's 16 MiB); a larger
    # one closes the connection after its first 4 bytes, before anything is buffered.
    max_frame_bytes: int = MAX_FRAME_BYTES
    # Incomplete frames over 64 KiB held at once, over all connections (Kafka's
    # queued.max.request.bytes): a connection starting one beyond it waits, unread.
    max_pending_frame_bytes: int = 256 << 20
    # How long a started frame over 64 KiB may take to arrive whole; then the
    # connection closes (a slow sender must not hold the budget above).
    frame_timeout_ms: int = 60_000
    # Idle and stalled connections (docs/operations.md, "Connections"): a wire connection
    # that completes no frame for this long while none of its requests runs is closed, so
    # silent peers and half-open sockets give their slot back. Clients close their own
    # idle connections sooner (the pool's `idle_close_ms`, 45 s) and heartbeat meanwhile.
    idle_timeout_ms: int = 60_000
    shutdown_timeout_ms: int = 10_000
    # The furthest a delayed message's delivery time may lie ahead (30 days).
    max_delay_ms: int = 30 * 86_400_000
    # How long a queue lock (LOCK, ordered consumers) lives after its last grant or renewal.
    lock_expiry_ms: int = 60_000
    # Replication (docs/replication.md). A group's members should agree on the mode;
    # the master's own setting decides whether it waits for a slave.
    replication: str = "none"
    repl_port: int = 10912
    election_ttl_s: int = 3      # the master's lease: failover within about this + 1 s
    repl_timeout_ms: int = 3000  # sync: the longest an ack waits for the in-sync slaves
    # A master closes a replication connection whose TLS handshake, or whose AUTH and
    # HELLO up to the master's answer, take longer than this (a silent peer's slot).
    repl_handshake_timeout_ms: int = 3000
    # Sync: the in-sync set's smallest size (the master included) for writes to be
    # acknowledged; below it they answer SlaveNotAvailableError at once (2 = strict).
    min_insync_replicas: int = 1
    repl_lag_bytes_max: int = 64 << 20    # a slave further behind is reported `lagging`
    # A PULL whose record lies further behind the log end than this gets
    # suggest_slave when a slave is live (reads of old data go to the slave).
    slave_read_lag_bytes: int = 256 << 20
    # namesrv address(es) the tracing exporter writes the broker's spans through (the
    # `%TRACE%` topic, docs/tracing.md); empty = spans go to the files / OTLP only.
    namesrv: str = ""
    # Authentication and permissions (docs/security.md): on, every wire request (and
    # the replication link) must be signed by a known identity and permitted. Set by
    # the mesh-wide FERRY_AUTH (FERRY_BROKER_AUTH wins when set).
    auth: bool = False
    auth_window_ms: int = 60_000      # a signed request's timestamp: at most this far behind
    auth_future_ms: int = 5_000       # ... and at most this far ahead (clock skew)
    auth_max_nonces: int = 500_000    # nonces remembered in the window (about 100 B each)
    # One access key's share of them: past it that identity alone is refused (BusyError).
    auth_max_nonces_per_key: int = 100_000
    # Optional TLS on the wire and replication ports: certificate and key files (PEM).
    # Mesh-wide FERRY_TLS_CERT / FERRY_TLS_KEY unless FERRY_BROKER_TLS_* are set.
    tls_cert: str = ""
    tls_key: str = ""

    def __post_init__(self) -> None:
        check_service(self, ENV_PREFIX, frozenset({"id", "auth_future_ms"}))
        if self.flush_mode not in FLUSH_MODES:
            raise ValueError(f"flush_mode must be one of {FLUSH_MODES}, not {self.flush_mode!r}")
        if not 1 <= self.default_queues <= 1024:
            raise ValueError("default_queues must be within 1..1024")
        if self.max_topics < 1 or self.max_topics_per_identity < 1:
            raise ValueError("max_topics and max_topics_per_identity must be at least 1")
        if self.max_held_pulls_per_conn >= self.max_inflight_per_conn:
            # Parked pulls are in flight too: at the in-flight limit reading
            # pauses, and the request that would get BusyError is never read.
            raise ValueError("max_held_pulls_per_conn must be below max_inflight_per_conn")
        if self.offsets_max_entries < 1 or self.offsets_max_per_identity < 1:
            raise ValueError("offsets_max_entries and offsets_max_per_identity must be positive")
        if self.retention_hours <= 0:
            raise ValueError("retention_hours must be positive")
        if not (0 < self.disk_retention_ratio <= self.disk_low_water_ratio
                < self.disk_high_water_ratio <= 1):
            raise ValueError("the disk ratios must be 0 < disk_retention_ratio <= "
                             "disk_low_water_ratio < disk_high_water_ratio <= 1")
        if self.max_message_bytes > 4 << 20:
            raise ValueError("max_message_bytes cannot exceed the protocol's 4 MiB body limit")
        if not self.max_message_bytes < self.max_frame_bytes <= MAX_FRAME_BYTES:
            raise ValueError("max_frame_bytes must exceed max_message_bytes (a SEND carries "
                             f"one) and be at most the protocol's {MAX_FRAME_BYTES}")
        if self.max_pending_frame_bytes < self.max_frame_bytes + 8:
            raise ValueError("max_pending_frame_bytes must hold one frame of max_frame_bytes")
        if self.replication not in REPLICATION_MODES:
            raise ValueError(f"replication must be one of {REPLICATION_MODES}, "
                             f"not {self.replication!r}")
        if self.replication != "none" and not self.etcd:
            raise ValueError("replication needs etcd (FERRY_BROKER_ETCD): roles come from "
                             "an election there")
        if self.election_ttl_s < 2:
            raise ValueError("election_ttl_s must be at least 2 (etcd's shortest lease)")

    @property
    def addr(self) -> str:
        """The wire address ("host:port") registered in etcd for clients."""
        return f"{self.advertise_host or self.host}:{self.port}"

    @property
    def http_addr(self) -> str:
        return f"{self.advertise_host or self.host}:{self.http_port}" if self.http_port else ""

    @property
    def repl_addr(self) -> str:
        """The replication address ("host:port") slaves dial; empty when not replicating."""
        if self.replication == "none":
            return ""
        return f"{self.advertise_host or self.host}:{self.repl_port}"

    @property
    def data_path(self) -> Path:
        return Path(self.data_dir)

    @property
    def auth_target(self) -> str:
        """What clients sign for (IDENTIFY's answer): `cluster/name/id`. The id tells a
        master from its slave, so a request captured at one is refused by the other."""
        return f"{self.cluster}/{self.name}/{self.id}"

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None,
                 overrides: Mapping[str, Any] | None = None) -> BrokerConfig:
        """Build from FERRY_BROKER_<FIELD> variables; `overrides` (non-None) win.

        The auth switch is mesh-wide: FERRY_AUTH, unless FERRY_BROKER_AUTH is set; so
        are FERRY_TLS_CERT / FERRY_TLS_KEY.
        """
        env = os.environ if env is None else env
        if ENV_PREFIX + "AUTH" not in env and "FERRY_AUTH" in env:
            env = {**env, ENV_PREFIX + "AUTH": "on" if auth_enabled(env) else "off"}
        for key in ("TLS_CERT", "TLS_KEY"):
            if ENV_PREFIX + key not in env and "FERRY_" + key in env:
                env = {**env, ENV_PREFIX + key: env["FERRY_" + key]}
        return from_env(cls, ENV_PREFIX, env, overrides)
