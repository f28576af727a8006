"""The book's entries (an open transaction, one broker's scan) and its low-water marks.

The leader commits, on each broker, group `ferry-txn-checker`'s offsets as
low-water marks (docs/transactions.md, "Leadership and failover"):

- on `%HALF%` queue 0 the offset of the lowest half still open (every half
  below it is resolved), else the scan position;
- on `%OP%` queue 0 the offset of the first op record of a half at or above
  that mark (`OpMarks`), else the scan position.

A new leader pulls both queues again from there, so every open half and every
op of a half it reads is read again; each mark carries the history id of the
record before it, so a replaced history makes the new leader re-read, never
skip. Pure: no I/O.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

OPEN = "open"

#: How many (half offset, op offset) marks are kept per broker; beyond, neighbours
#: are merged (the mark only gets lower: a few more ops are read again, none missed).
MAX_MARKS = 4096


class OpMarks:
    """The lowest %OP% offset whose op names a half at or above a given %HALF% offset.

    Ops come in %OP% offset order. An op (h, o) is only ever the answer while no
    earlier op with a half at or above h is still wanted, so the marks keep half
    offsets strictly increasing (a monotonic queue): `low(L)` drops the marks of
    halves below L (L only grows) and answers the first one left.
    """

    __slots__ = ("_marks",)

    def __init__(self, rows: list[list[Any]] | None = None) -> None:
        # (half offset, op offset, history id of the op record before it)
        self._marks: deque[tuple[int, int, str | None]] = deque()
        for h, o, hist in rows or []:
            self.add(int(h), int(o), hist if isinstance(hist, str) else None)

    def __len__(self) -> int:
        return len(self._marks)

    def add(self, half_offset: int, op_offset: int, prev_hist: str | None) -> None:
        """An op record at `op_offset` (read in order) ended the half at `half_offset`."""
        marks = self._marks
        if marks and half_offset <= marks[-1][0]:
            return  # an earlier op with a half at least as high covers it
        marks.append((half_offset, op_offset, prev_hist))
        if len(marks) > MAX_MARKS:
            self._thin()

    def _thin(self) -> None:
        """Merge neighbours: (h1, o1), (h2, o2) -> (h2, o1). Still increasing, only lower."""
        old = list(self._marks)
        merged = [(old[i + 1][0], old[i][1], old[i][2]) for i in range(0, len(old) - 1, 2)]
        if len(old) % 2:
            merged.append(old[-1])
        self._marks = deque(merged)

    def low(self, half_low: int) -> tuple[int, str | None] | None:
        """(op offset, its history id) of the first op of a half >= `half_low`; None if none."""
        marks = self._marks
        while marks and marks[0][0] < half_low:
            marks.popleft()
        if not marks:
            return None
        _, op_offset, hist = marks[0]
        return op_offset, hist

    def cut(self, op_offset: int) -> None:
        """The op scan moved back to `op_offset` (a replaced history): the marks of ops
        from there on were of the old one."""
        while self._marks and self._marks[-1][1] >= op_offset:
            self._marks.pop()

    def rows(self) -> list[list[Any]]:
        return [list(m) for m in self._marks]


def checks_by_age(first_due_ms: int, at_ms: int, interval_ms: int, max_checks: int) -> int:
    """The checks a half read again by a new leader counts as done.

    On the nominal schedule a half is checked at `first_due_ms` and every
    `interval_ms` after; a new leader at `at_ms` counts the slots passed, less the
    latest one (its check may not have gone out: the new leader sends it now), at
    most `max_checks` (then its discard is due now). So a takeover costs a half at
    most one check more than the schedule, never one less, and moves its discard by
    at most one interval.
    """
    if at_ms < first_due_ms:
        return 0
    slots = (at_ms - first_due_ms) // interval_ms + 1
    return int(min(max_checks, slots - 1))


@dataclass(slots=True)
class OpenTxn:
    """A half message with no op record yet, and where its checks stand."""

    msg_id: str  # 32 upper-case hex: the transaction id
    group: str
    broker: str
    topic: str  # the real topic it commits to
    half_offset: int
    store_ms: int
    immunity_ms: int
    checks: int = 0
    next_check_ms: int = 0  # after a check: when to look again
    in_flight: bool = False  # a CHECK or END for it is under way
    heap_key: int = -1  # the due time it is queued under (stale heap entries differ)
    # A TRACED half's W3C context (TRACEPARENT / TRACESTATE), for the check span; kept in
    # memory only, not in the checkpoint: a check after a restart is not traced.
    trace: dict[str, str] | None = None
    prev_hist: str | None = None  # history id of the %HALF% record before it (issue 23)

    @property
    def due_ms(self) -> int:
        return max(self.store_ms + self.immunity_ms, self.next_check_ms)

    def to_row(self) -> list[Any]:
        return [self.msg_id, self.group, self.topic, self.half_offset, self.store_ms,
                self.immunity_ms, self.checks, self.next_check_ms, self.prev_hist]

    @classmethod
    def from_row(cls, broker: str, row: list[Any]) -> OpenTxn:
        msg_id, group, topic, half_offset, store_ms, immunity_ms, checks, next_ms = row[:8]
        hist = row[8] if len(row) > 8 and isinstance(row[8], str) else None
        return cls(str(msg_id), str(group), broker, str(topic), int(half_offset),
                   int(store_ms), int(immunity_ms), int(checks), int(next_ms), prev_hist=hist)

    def describe(self) -> dict[str, Any]:
        return {"msg_id": self.msg_id, "state": OPEN, "group": self.group,
                "broker": self.broker, "topic": self.topic, "half_offset": self.half_offset,
                "store_ms": self.store_ms, "immunity_ms": self.immunity_ms,
                "checks": self.checks, "next_check_ms": self.due_ms}


@dataclass
class BrokerScan:
    """One broker's scan: next queue offsets of %HALF% and %OP%, its open halves."""

    name: str
    half_next: int = 0
    op_next: int = 0
    open: dict[str, OpenTxn] = field(default_factory=dict)
    # Ops seen before their half: id -> (HALF_OFFSET, state).
    early_ops: dict[str, tuple[int, str]] = field(default_factory=dict)
    # Wall time (ms) up to which every op record stored on the broker has been
    # seen (not persisted: 0 until the op scan catches up after a start).
    op_synced_ms: int = 0
    # History ids of the records before half_next / op_next (issue 16), kept with them.
    half_hist: str | None = None
    op_hist: str | None = None
    op_marks: OpMarks = field(default_factory=OpMarks)  # for the %OP% low-water mark
    # False until the positions are known: a broker new to this leader's book starts
    # from the low-water marks committed on it (scan.py).
    settled: bool = True
    # Halves stored before this (a takeover) count the checks their age allows.
    derive_before_ms: int = 0

    @property
    def half_low(self) -> int:
        """The %HALF% offset below which every half is resolved (committed for visibility)."""
        return min((t.half_offset for t in self.open.values()), default=self.half_next)

    def low_water(self) -> tuple[tuple[int, str | None], tuple[int, str | None]]:
        """The (offset, history id) low-water marks of %HALF% and %OP% (lowwater.py)."""
        lowest = min(self.open.values(), key=lambda t: t.half_offset, default=None)
        half = ((lowest.half_offset, lowest.prev_hist) if lowest is not None
                else (self.half_next, self.half_hist))
        return half, self.op_marks.low(half[0]) or (self.op_next, self.op_hist)
