"""Offset resets a group's live members have not picked up yet (issue 25).

An operator's reset (`ferry group reset-offsets`, a COMMIT_OFFSET with `reset`)
writes the committed offset; a member that holds the queue still has its own
position in memory and would commit it over the reset at its next commit.
Like RocketMQ's RESET_CONSUMER_CLIENT_OFFSET, the broker tells the member: it
remembers the reset here, answers the member's next PULL at another offset with
OFFSET_RESET (`next_offset` the reset position; the member drops what it
buffered and continues there) and ignores the member's commits meanwhile. A PULL
at the reset position clears the mark: from then on the member's commits are its
own again.

Kept in memory only: a broker restart drops the marks (members reconnect and
re-read their committed offsets after a rebalance anyway). Bounded: at most
`MAX_PENDING_RESETS`, past that the oldest mark is dropped; and for
`PENDING_RESET_TTL_MS`, so that a member that never pulls from this broker
(it reads from a slave meanwhile) is not ignored for good.
"""
from __future__ import annotations

import time
from collections.abc import Callable

from ferry_broker.offsets_codec import OffsetKey

#: Marks kept at most (only identities with `reset` on a group create them).
MAX_PENDING_RESETS = 10_000
#: How long a mark waits for a member's PULL: well past a long poll and a rebalance.
PENDING_RESET_TTL_MS = 120_000


class PendingResets:
    """(group, topic, queue_id) -> the offset an operator reset it to, until a member
    pulls from there."""

    def __init__(self, max_entries: int = MAX_PENDING_RESETS,
                 ttl_ms: int = PENDING_RESET_TTL_MS,
                 clock_ms: Callable[[], float] | None = None) -> None:
        self._marks: dict[OffsetKey, tuple[int, float]] = {}   # -> (offset, expiry)
        self._max = max_entries
        self._ttl_ms = ttl_ms
        self._clock_ms = clock_ms or (lambda: time.monotonic() * 1000)

    def __len__(self) -> int:
        return len(self._marks)

    def mark(self, key: OffsetKey, offset: int) -> None:
        self._marks.pop(key, None)
        self._marks[key] = (offset, self._clock_ms() + self._ttl_ms)
        while len(self._marks) > self._max:
            del self._marks[next(iter(self._marks))]

    def get(self, key: OffsetKey) -> int | None:
        """The reset position members have not picked up, None when there is none."""
        mark = self._marks.get(key)
        if mark is None:
            return None
        if mark[1] <= self._clock_ms():
            del self._marks[key]
            return None
        return mark[0]

    def redirect(self, key: OffsetKey, offset: int) -> int | None:
        """Where a member's PULL at `offset` must go instead (None: serve it). A PULL at
        the reset position itself clears the mark: the member has picked it up."""
        target = self.get(key)
        if target is not None and target == offset:
            del self._marks[key]
            return None
        return target
