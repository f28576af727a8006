"""What put and get return: outcome enums and result values."""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import NamedTuple


class PutStatus(enum.Enum):
    """Outcome of an append: always OK (the record is written; failures raise).

    Durability is separate: in SYNC mode the caller waits on `wait_durable`, whose
    future fails with FlushTimeoutError when the disk is too slow.
    """

    OK = "OK"


class PutResult(NamedTuple):
    """Where one message was stored (a NamedTuple: the put path makes one per message)."""

    status: PutStatus
    msg_id: bytes
    phy_offset: int
    size: int
    queue_offset: int
    store_ts_ms: int

    @property
    def end_offset(self) -> int:
        """The commit-log offset just past this record: what `wait_durable` takes."""
        return self.phy_offset + self.size


class BatchPutResult(NamedTuple):
    """Where a `put_encoded_batch` went: its records are consecutive in one queue.

    Message i of the batch got queue offset `first_queue_offset + i`; the records
    follow each other in the commit log (a segment roll may put a blank marker
    between two of them).
    """

    status: PutStatus
    message_count: int
    first_queue_offset: int
    first_phy_offset: int
    end_offset: int  # just past the last record: what `wait_durable` takes
    store_ts_ms: int


class GetStatus(enum.Enum):
    """Outcome of a pull from one queue (RocketMQ's names)."""

    FOUND = "FOUND"
    NO_MATCHED_MESSAGE = "NO_MATCHED_MESSAGE"  # entries were scanned, none passed the filter
    NO_MESSAGE_IN_QUEUE = "NO_MESSAGE_IN_QUEUE"  # the queue is unknown or never had a message
    OFFSET_TOO_SMALL = "OFFSET_TOO_SMALL"  # below min_offset (deleted by retention)
    OFFSET_OVERFLOW_ONE = "OFFSET_OVERFLOW_ONE"  # exactly max_offset: caught up, long-poll
    OFFSET_OVERFLOW_BADLY = "OFFSET_OVERFLOW_BADLY"  # beyond max_offset


@dataclass(frozen=True)
class GetResult:
    """Records read from one queue and where the consumer should continue."""

    status: GetStatus
    records: list[memoryview]  # raw records, zero-copy views of the commit log
    next_queue_offset: int
    min_offset: int
    max_offset: int

    @property
    def total_bytes(self) -> int:
        return sum(len(r) for r in self.records)
