"""The low-water mark: per %SCHEDULE% queue, how far every record is settled.

The brokers' replicated %SCHEDULE% is the truth; the scheduler's local log and
wheel are a cache of one leadership term. The offset the scheduler commits for
group `ferry-delay-scheduler` is a LOW-WATER mark: every record of the queue
below it is settled (its DELIVER_DUE was acknowledged, it was cancelled, or it
was rolled: re-stored in %SCHEDULE% as a new copy). A record at or past it may
still be pending, so a new leader that starts from the committed offsets loses
nothing; it may deliver again what was settled past the mark (at-least-once).

`LowWater` keeps, per queue, the batches taken in this term (first offset, end,
history id, offsets not settled yet) and, per local record (`phy_offset`),
which queue offset it came from. Memory: one entry per pending message taken
in this term (rolling keeps the oldest ones young, see roll.py).

The commit carries the history id of the record before the mark (issue 16):
a broker whose queue history was replaced since sends the reader back, never
past a record it did not take.
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field


def source_key(broker: str, queue_id: int) -> str:
    return f"{broker}/{queue_id}"


@dataclass(eq=False)
class _Batch:
    """Records of one PULL answer taken into the cache: one history, offsets [start, end)."""

    start: int
    end: int
    hist: str | None
    taken_ms: int
    open: dict[int, int] = field(default_factory=dict)  # offsets not settled yet -> phy


class QueueMark:
    """One queue's low-water mark and what was taken past it in this term."""

    def __init__(self, broker: str, queue_id: int, offset: int, hist: str | None) -> None:
        self.broker, self.queue_id = broker, queue_id
        self.base, self.base_hist = offset, hist  # everything below `base` is settled
        self.batches: deque[_Batch] = deque()
        self.committed: tuple[int, str | None] = (offset, hist)

    @property
    def taken(self) -> int:
        """The next queue offset to take (every offset below it is held or settled)."""
        return self.batches[-1].end if self.batches else self.base

    @property
    def hist(self) -> str | None:
        """The history of the record at `taken` - 1 (where reading continues)."""
        return self.batches[-1].hist if self.batches else self.base_hist

    def low_water(self) -> tuple[int, str | None]:
        """The offset every record below which is settled, and the history of the one before."""
        while self.batches and not self.batches[0].open:
            done = self.batches.popleft()
            self.base, self.base_hist = done.end, done.hist
        if not self.batches:
            return self.base, self.base_hist
        first = self.batches[0]
        lowest = min(first.open)
        if lowest == first.start:
            return self.base, self.base_hist
        return lowest, first.hist


class LowWater:
    """The marks of every queue read in this term and which record came from where."""

    def __init__(self) -> None:
        self.marks: dict[str, QueueMark] = {}
        self._where: dict[int, tuple[_Batch, int]] = {}  # phy -> (batch, queue offset)

    def mark(self, broker: str, queue_id: int) -> QueueMark | None:
        return self.marks.get(source_key(broker, queue_id))

    def open(self, broker: str, queue_id: int, offset: int, hist: str | None) -> QueueMark:
        """The queue's mark, made from its committed offset the first time it is read."""
        key = source_key(broker, queue_id)
        mark = self.marks.get(key)
        if mark is None:
            mark = self.marks[key] = QueueMark(broker, queue_id, offset, hist)
        return mark

    def held(self, mark: QueueMark, queue_offset: int) -> bool:
        """True when a record at this offset (of the history being read) was taken already."""
        return queue_offset < mark.taken

    def rewind(self, mark: QueueMark, offset: int, hist: str | None) -> int:
        """The broker sent the reader back to `offset` (its history there was replaced): the
        cached records at or past it stay in the wheel (they are delivered) but no longer
        pin the mark. Returns how many were detached."""
        detached = 0
        while mark.batches and mark.batches[-1].end > offset:
            batch = mark.batches[-1]
            for gone in [o for o in batch.open if o >= offset]:
                self._where.pop(batch.open.pop(gone), None)
                detached += 1
            if batch.start >= offset:
                mark.batches.pop()
            else:
                batch.end = offset
                break
        if offset < mark.base:
            mark.base, mark.base_hist = offset, hist
        return detached

    def add(self, mark: QueueMark, taken: list[tuple[int, int]], end: int,
            hist: str | None) -> None:
        """Records (queue offset, local phy) taken from one answer ending at `end`."""
        if not taken:
            self.skip(mark, end, hist)
            return
        batch = _Batch(mark.taken, end, hist, int(time.time() * 1000))
        for queue_offset, phy in taken:
            batch.open[queue_offset] = phy
            self._where[phy] = (batch, queue_offset)
        mark.batches.append(batch)

    def skip(self, mark: QueueMark, end: int, hist: str | None) -> None:
        """Offsets up to `end` held nothing to take (filtered, or none): settled at once."""
        if end > mark.taken:
            mark.batches.append(_Batch(mark.taken, end, hist, int(time.time() * 1000)))

    def settle(self, phys: list[int]) -> None:
        """These local records were delivered, cancelled or rolled."""
        where = self._where
        for phy in phys:
            found = where.pop(phy, None)
            if found is not None:
                found[0].open.pop(found[1], None)

    def old_pending(self, mark: QueueMark, taken_before_ms: int, limit: int) -> list[int]:
        """Local phys of up to `limit` unsettled records of `mark` taken before the time,
        oldest first (what pins its low-water mark)."""
        out: list[int] = []
        for batch in mark.batches:
            if batch.taken_ms >= taken_before_ms or len(out) >= limit:
                break
            out += [batch.open[o] for o in sorted(batch.open)][:limit - len(out)]
        return out

    @property
    def pinned(self) -> int:
        """Records taken in this term and not settled yet."""
        return len(self._where)
