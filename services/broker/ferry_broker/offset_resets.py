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
`MAX_PENDING_RESETS`; past that the oldest mark is dropped.
"""
from __future__ import annotations

from ferry_broker.offsets_codec import OffsetKey

#: Marks kept at most (only identities with `reset` on a group create them).
MAX_PENDING_RESETS = 10_000


class PendingResets:
    """(group, topic, queue_id) -> the offset an operator reset it to, until a member
    pulls from there."""

    def __init__(self, max_entries: int = MAX_PENDING_RESETS) -> None:
        self._marks: dict[OffsetKey, int] = {}
        self._max = max_entries

    def __len__(self) -> int:
        return len(self._marks)

    def mark(self, key: OffsetKey, offset: int) -> None:
        self._marks.pop(key, None)
        self._marks[key] = offset
        while len(self._marks) > self._max:
            del self._marks[next(iter(self._marks))]

    def get(self, key: OffsetKey) -> int | None:
        """The reset position members have not picked up, None when there is none."""
        return self._marks.get(key)

    def redirect(self, key: OffsetKey, offset: int) -> int | None:
        """Where a member's PULL at `offset` must go instead (None: serve it). A PULL at
        the reset position itself clears the mark: the member has picked it up."""
        target = self._marks.get(key)
        if target is None:
            return None
        if target == offset:
            del self._marks[key]
            return None
        return target
