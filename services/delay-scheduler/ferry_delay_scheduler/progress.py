"""The low-water mark: per %SCHEDULE% queue, how far every record is settled.

The brokers' replicated %SCHEDULE% is the truth; the scheduler's local log and
wheel are a cache of one leadership term. The offset the scheduler commits for
group `ferry-delay-scheduler` is a LOW-WATER mark: every record of the queue
below it is settled (its DELIVER_DUE was acknowledged, it was cancelled, or it
was rolled: re-stored in %SCHEDULE% as a new copy). A record at or past it may
still be pending, so a new leader that starts from the committed offsets loses
nothing; it may deliver again what was settled past the mark (at-least-once).

`LowWater` keeps, per queue, the batches taken in this term: one per PULL
answer (its offsets [start, end), history id, and for each record taken its
queue offset, local `phy_offset` and a settled flag, in arrays). A batch's
records were appended to the local log together, so their phy offsets form one
increasing run, and the batches of a term one increasing sequence: a settled
phy finds its batch and entry by bisection. Memory: about 17 bytes per record
of a batch not wholly settled (a million pending: about 17 MB).

The commit carries the history id of the record before the mark (issue 16):
a broker whose queue history was replaced since sends the reader back, never
past a record it did not take.
"""
from __future__ import annotations

import bisect
import time
from array import array
from collections import deque


def source_key(broker: str, queue_id: int) -> str:
    return f"{broker}/{queue_id}"


class _Batch:
    """Records of one PULL answer taken into the cache: one history, offsets [start, end)."""

    __slots__ = ("start", "end", "hist", "taken_ms", "offsets", "phys", "settled", "open")

    def __init__(self, start: int, end: int, hist: str | None,
                 taken: list[tuple[int, int]]) -> None:
        self.start, self.end, self.hist = start, end, hist
        self.taken_ms = int(time.time() * 1000)
        self.offsets = array("q", [o for o, _ in taken])  # increasing
        self.phys = array("q", [p for _, p in taken])  # increasing
        self.settled = bytearray(len(taken))  # 1: delivered, cancelled, rolled or detached
        self.open = len(taken)

    def settle_at(self, i: int) -> bool:
        """Settle entry `i`; True when it was open. A batch wholly settled frees its arrays
        (its offsets and history still move the mark)."""
        if self.settled[i]:
            return False
        self.settled[i] = 1
        self.open -= 1
        if not self.open:
            self.offsets, self.phys, self.settled = array("q"), array("q"), bytearray()
        return True

    def open_indexes(self) -> list[int]:
        return [i for i, done in enumerate(self.settled) if not done]


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
        lowest = first.offsets[first.settled.index(0)]
        if lowest == first.start:
            return self.base, self.base_hist
        return lowest, first.hist


class LowWater:
    """The marks of every queue read in this term and which record came from where."""

    def __init__(self) -> None:
        self.marks: dict[str, QueueMark] = {}
        self._firsts: list[int] = []  # first phy of each batch with records, increasing
        self._batches: list[_Batch] = []  # ... and the batch
        self._dead = 0  # batches in those lists with nothing open
        self.pinned = 0  # records taken in this term and not settled yet

    def mark(self, broker: str, queue_id: int) -> QueueMark | None:
        return self.marks.get(source_key(broker, queue_id))

    def open(self, broker: str, queue_id: int, offset: int, hist: str | None) -> QueueMark:
        """The queue's mark, made from its committed offset the first time it is read."""
        key = source_key(broker, queue_id)
        mark = self.marks.get(key)
        if mark is None:
            mark = self.marks[key] = QueueMark(broker, queue_id, offset, hist)
        return mark

    def rewind(self, mark: QueueMark, offset: int, hist: str | None) -> int:
        """The broker sent the reader back to `offset` (its history there was replaced): the
        cached records at or past it stay in the wheel (they are delivered) but no longer
        pin the mark. Returns how many were detached."""
        detached = 0
        while mark.batches and mark.batches[-1].end > offset:
            batch = mark.batches[-1]
            for i in range(bisect.bisect_left(batch.offsets, offset), len(batch.offsets)):
                if batch.settle_at(i):
                    detached += 1
                    if not batch.open:  # its arrays are freed: nothing further is open
                        self._dead += 1
                        break
            if batch.start >= offset:
                mark.batches.pop()
            else:
                batch.end = offset
                break
        self.pinned -= detached
        if offset < mark.base:
            mark.base, mark.base_hist = offset, hist
        return detached

    def add(self, mark: QueueMark, taken: list[tuple[int, int]], end: int,
            hist: str | None) -> None:
        """Records (queue offset, local phy) taken from one answer ending at `end`, in the
        order they were appended to the local log."""
        if end <= mark.taken and not taken:
            return
        batch = _Batch(mark.taken, end, hist, taken)
        mark.batches.append(batch)
        if taken:
            self._firsts.append(taken[0][1])
            self._batches.append(batch)
            self.pinned += len(taken)

    def settle(self, phys: list[int]) -> None:
        """These local records were delivered, cancelled or rolled."""
        firsts, batches = self._firsts, self._batches
        for phy in phys:
            k = bisect.bisect_right(firsts, phy) - 1
            if k < 0:
                continue
            batch = batches[k]
            i = bisect.bisect_left(batch.phys, phy)
            if i < len(batch.phys) and batch.phys[i] == phy and batch.settle_at(i):
                self.pinned -= 1
                self._dead += not batch.open
        if self._dead > 64 and self._dead * 2 > len(batches):
            self._drop_settled()

    def _drop_settled(self) -> None:
        keep = [k for k, b in enumerate(self._batches) if b.open]
        self._firsts = [self._firsts[k] for k in keep]
        self._batches = [self._batches[k] for k in keep]
        self._dead = 0

    def old_pending(self, mark: QueueMark, taken_before_ms: int, limit: int) -> list[int]:
        """Local phys of up to `limit` unsettled records of `mark` taken before the time,
        oldest first (what pins its low-water mark)."""
        out: list[int] = []
        for batch in mark.batches:
            if batch.taken_ms >= taken_before_ms or len(out) >= limit:
                break
            out += [batch.phys[i] for i in batch.open_indexes()][:limit - len(out)]
        return out
