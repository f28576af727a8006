"""Configuration of a MessageStore: where it lives, how it cuts files, when it flushes."""
from __future__ import annotations

import enum
import resource
from collections.abc import Callable
from dataclasses import dataclass

from ferry.codec.limits import (
    MAX_BODY_BYTES,
    MAX_HOST_BYTES,
    MAX_KEYS_BYTES,
    MAX_PROPERTIES_BYTES,
    MAX_TAGS_BYTES,
    MAX_TOPIC_BYTES,
)
from ferry.codec.record import HEADER_SIZE
from ferry.errors import StoreError

GIB = 1 << 30
MIB = 1 << 20


class FlushMode(enum.Enum):
    """When an append counts as durable.

    ASYNC: `put` returns once the record is in the page cache (it survives the
    death of the process, not of the machine); a flush thread fdatasyncs every
    `flush_interval_ms`. SYNC: the broker acknowledges only after
    `wait_durable`, which group-commits many appends behind one fdatasync.
    """

    ASYNC = "async"
    SYNC = "sync"


@dataclass(frozen=True)
class StoreConfig:
    """Every knob of the store; the defaults run one broker on one machine."""

    root_dir: str
    commitlog_segment_bytes: int = GIB
    cq_entries_per_segment: int = 300_000
    # Consume-queue segments mapped at once over all queues; each mapping holds a
    # file descriptor, so this bounds the store's descriptors however many queues
    # exist. None: a quarter of the process's RLIMIT_NOFILE soft limit when the
    # store opens, within [64, 8192] (256 at the common limit of 1024). More active
    # queues than this cost a remap per dispatch: raise the limit, not just this.
    cq_max_mapped_segments: int | None = None
    index_max_slots: int = 5_000_000
    index_max_entries: int = 20_000_000
    flush_mode: FlushMode = FlushMode.ASYNC
    flush_interval_ms: int = 500
    sync_flush_timeout_ms: int = 5000
    # How often the checkpoint thread writes the checkpoint (and flushes consume queues
    # and the index first): bounds the part of the log that crash recovery rescans.
    checkpoint_interval_ms: int = 1000
    retention_hours: float = 72
    disk_high_water_ratio: float = 0.75
    # Returns the used fraction (0..1) of the disk holding root_dir; tests inject one.
    disk_usage_fn: Callable[[str], float] | None = None
    max_message_bytes: int = MAX_BODY_BYTES
    store_host: str = "127.0.0.1:10911"
    # How far ahead of the writer a background thread pulls the active commit-log
    # segment into the page cache (see warmer.py); 0 turns warming off.
    warm_ahead_bytes: int = 64 * MIB

    def __post_init__(self) -> None:
        if self.max_message_bytes <= 0:
            raise StoreError("max_message_bytes must be > 0")
        if self.commitlog_segment_bytes < self.max_record_bytes + 8:
            raise StoreError(
                f"commitlog_segment_bytes {self.commitlog_segment_bytes} cannot hold one record "
                f"of max_message_bytes {self.max_message_bytes} (needs {self.max_record_bytes + 8})"
            )
        if self.flush_interval_ms <= 0 or self.sync_flush_timeout_ms <= 0:
            raise StoreError("flush_interval_ms and sync_flush_timeout_ms must be > 0")
        if self.warm_ahead_bytes < 0:
            raise StoreError("warm_ahead_bytes must be >= 0")
        if self.cq_entries_per_segment <= 0:
            raise StoreError("cq_entries_per_segment must be > 0")
        if self.cq_max_mapped_segments is not None and self.cq_max_mapped_segments < 2:
            raise StoreError("cq_max_mapped_segments must be >= 2")
        if len(self.store_host.encode()) > MAX_HOST_BYTES:
            raise StoreError("store_host is too long")

    @property
    def max_properties_bytes(self) -> int:
        """Encoded properties are bounded apart from the body (RocketMQ allows 32 KiB)."""
        return MAX_PROPERTIES_BYTES

    @property
    def max_record_bytes(self) -> int:
        """The largest record a valid message can encode to."""
        return (HEADER_SIZE + MAX_TOPIC_BYTES + 2 * MAX_HOST_BYTES + MAX_TAGS_BYTES + MAX_KEYS_BYTES
                + self.max_properties_bytes + self.max_message_bytes)

    @property
    def mapped_segments_budget(self) -> int:
        """`cq_max_mapped_segments`, or the budget derived from RLIMIT_NOFILE."""
        if self.cq_max_mapped_segments is not None:
            return self.cq_max_mapped_segments
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft == resource.RLIM_INFINITY:
            return 8192
        return max(64, min(8192, soft // 4))

    @property
    def retention_ms(self) -> int:
        return int(self.retention_hours * 3_600_000)
