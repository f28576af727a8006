"""The PULL request and its answer as typed values (docs/protocol.md, PULL).

Every reader of a queue (the consumer's fetcher, `ferry.client.reading`, the
Spark source) builds its PULL with `PullRequest` and reads the answer through
`PullAnswer.parse`, the one place where the answer's fields are read and its
status string becomes a `PullStatus`. The broker's handler answers with the
same names (`ferry_broker.handlers.pull`), and its limits are these.
"""
from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ferry.codec.record import StoredMessage, iter_records
from ferry.errors import MalformedRequestError

#: A PULL asks for at most this many records (`max_count`).
MAX_PULL_COUNT = 1024
#: A PULL answer carries at most this many bytes of records (`max_bytes`): under a frame.
MAX_PULL_BYTES = 8 << 20


class PullStatus(enum.Enum):
    """What a PULL answer says about the queue at the asked offset (RocketMQ's names)."""

    FOUND = "FOUND"                                # records in the body
    NO_MATCHED_MESSAGE = "NO_MATCHED_MESSAGE"      # entries scanned, none passed the filter
    NO_MESSAGE_IN_QUEUE = "NO_MESSAGE_IN_QUEUE"    # the queue is unknown or never had one
    OFFSET_TOO_SMALL = "OFFSET_TOO_SMALL"          # below the oldest kept (retention)
    OFFSET_OVERFLOW_ONE = "OFFSET_OVERFLOW_ONE"    # exactly at the end: caught up
    OFFSET_OVERFLOW_BADLY = "OFFSET_OVERFLOW_BADLY"  # past the end (no `hist` given)
    #: The broker's log is not the continuation of the history named by `hist` (issue 16):
    #: `next_offset` is where they part, perhaps before the asked offset.
    HISTORY_DIVERGED = "HISTORY_DIVERGED"
    #: An operator reset the group's committed offset of this queue (issue 25):
    #: `next_offset` is the new position; what the reader buffered is dropped.
    OFFSET_RESET = "OFFSET_RESET"

    @property
    def reseeks(self) -> bool:
        """The position goes to `next_offset`, forward or back (records are read again
        rather than skipped)."""
        return self in _RESEEK

    @property
    def caught_up(self) -> bool:
        """Nothing more to read at the asked offset now."""
        return self in _CAUGHT_UP


_RESEEK = frozenset({PullStatus.OFFSET_TOO_SMALL, PullStatus.OFFSET_OVERFLOW_BADLY,
                     PullStatus.HISTORY_DIVERGED, PullStatus.OFFSET_RESET})
_CAUGHT_UP = frozenset({PullStatus.NO_MESSAGE_IN_QUEUE, PullStatus.OFFSET_OVERFLOW_ONE,
                        PullStatus.NO_MATCHED_MESSAGE})
_STATUS = {s.value: s for s in PullStatus}


@dataclass(frozen=True, slots=True)
class PullRequest:
    """The fields of one PULL (None: the field is left out and the broker's default holds)."""

    group: str
    topic: str
    queue_id: int
    offset: int
    max_count: int
    max_wait_ms: int = 0
    max_bytes: int | None = None
    hist: str | None = None     # history of the record at offset - 1, as last answered
    tags: str | None = None
    sql: str | None = None
    unchecked: bool = False     # the reader checks every record: the broker need not

    def fields(self) -> dict[str, Any]:
        out: dict[str, Any] = {"group": self.group, "topic": self.topic,
                               "queue_id": self.queue_id, "offset": self.offset,
                               "max_count": self.max_count, "max_wait_ms": self.max_wait_ms,
                               "tags": self.tags, "sql": self.sql}
        if self.max_bytes is not None:
            out["max_bytes"] = self.max_bytes
        if self.hist is not None:
            out["hist"] = self.hist
        if self.unchecked:
            out["unchecked"] = True
        return out


@dataclass(frozen=True, slots=True)
class PullAnswer:
    """One PULL answer: its status, where to read next, the queue's bounds, the history
    of the record at `next_offset - 1` (None when not named) and the raw records."""

    status: PullStatus
    next_offset: int
    min_offset: int
    max_offset: int
    hist: str | None = None
    suggest_slave: bool = False
    body: bytes | memoryview = b""

    @classmethod
    def parse(cls, fields: Mapping[str, Any], body: bytes | memoryview,
              offset: int) -> PullAnswer:
        """The answer to a PULL from `offset` (missing offsets default to it, as the
        broker's older answers allowed); MalformedRequestError on an unknown status."""
        status = _STATUS.get(str(fields.get("status", "")))
        if status is None:
            raise MalformedRequestError(
                f"PULL answered with an unknown status {fields.get('status')!r}")
        next_offset = int(fields.get("next_offset", offset))
        hist = fields.get("hist")
        return cls(status, next_offset, int(fields.get("min_offset", 0)),
                   int(fields.get("max_offset", next_offset)),
                   hist if isinstance(hist, str) else None,
                   fields.get("suggest_slave") is True, body)

    @property
    def found(self) -> bool:
        return self.status is PullStatus.FOUND

    @property
    def at_end(self) -> bool:
        """Every record stored before this answer was read (or skipped) by it."""
        return self.status.caught_up or self.next_offset >= self.max_offset

    def stored(self) -> list[StoredMessage]:
        """The body's records, each checked (size, magic, CRC); CorruptRecordError if not."""
        return list(iter_records(self.body))
