"""Queue ranges: what each Spark partition reads, planned from the queues' bounds.

Planning is pure: `plan_ranges` takes each queue's bounds (and, for reads by
time, the offsets found for the asked timestamps) and the options, and returns
one `QueueRange` per queue with something to read. The out-of-range policy is
applied here: "fail" raises OffsetOutOfRangeError naming the queue, the asked
and the available range; "clamp" moves the offset into the available range.
`split_ranges` then cuts large ranges so that a read has at least
`minPartitions` partitions (as Kafka's source does with its option of that name).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ferry.errors import OffsetOutOfRangeError
from pyspark.sql.datasource import InputPartition

from ferry_spark.source.options import EARLIEST, LATEST, OffsetSpec


@dataclass(frozen=True, slots=True)
class QueueBounds:
    """One queue of `topic` as its broker reports it: `min_offset` oldest kept, `max_offset`
    next to write.

    `start_at_time` / `end_at_time`: the first offset stored at or after the
    asked starting / ending timestamp (None when no timestamp was asked).
    """

    topic: str
    broker: str
    queue_id: int
    min_offset: int
    max_offset: int
    start_at_time: int | None = None
    end_at_time: int | None = None


class QueueRange(InputPartition):
    """One Spark partition: queue `queue_id` of `broker`, offsets [start, end)."""

    def __init__(self, topic: str, broker: str, queue_id: int, start: int, end: int) -> None:
        super().__init__((topic, broker, queue_id, start, end))
        self.topic = topic
        self.broker = broker
        self.queue_id = queue_id
        self.start = start
        self.end = end

    @property
    def where(self) -> str:
        return f"{self.topic} {self.broker}/{self.queue_id}"

    def __repr__(self) -> str:
        return f"QueueRange({self.where} [{self.start}, {self.end}))"


def _resolve(spec: OffsetSpec, q: QueueBounds, at_time: int | None) -> int:
    if spec.timestamp_ms is not None and at_time is not None:
        return at_time
    offset = spec.for_queue(q.topic, q.broker, q.queue_id)
    if offset == EARLIEST:
        return q.min_offset
    if offset == LATEST:
        return q.max_offset
    return offset


def check_in_range(q: QueueBounds, offset: int, what: str, fail: bool) -> int:
    """`offset` if the queue holds it (or it is the queue's end); else raise or clamp."""
    if q.min_offset <= offset <= q.max_offset:
        return offset
    if fail:
        raise OffsetOutOfRangeError(
            f"ferry source: {what} offset {offset} of {q.topic} {q.broker}/{q.queue_id} is out of "
            f"range: the queue holds [{q.min_offset}, {q.max_offset}) "
            f"(option offsetOutOfRange=clamp reads what is there instead)")
    return min(max(offset, q.min_offset), q.max_offset)


def plan_ranges(bounds: Sequence[QueueBounds], starting: OffsetSpec, ending: OffsetSpec,
                fail_out_of_range: bool) -> list[QueueRange]:
    """One range per queue with offsets to read, sorted by topic, broker and queue id."""
    out = []
    for q in sorted(bounds, key=lambda b: (b.topic, b.broker, b.queue_id)):
        start = check_in_range(q, _resolve(starting, q, q.start_at_time), "starting",
                               fail_out_of_range)
        end = check_in_range(q, _resolve(ending, q, q.end_at_time), "ending", fail_out_of_range)
        if start > end:
            if fail_out_of_range:
                raise OffsetOutOfRangeError(
                    f"ferry source: {q.topic} {q.broker}/{q.queue_id}: starting offset {start} "
                    f"is after ending offset {end}")
            continue
        if start < end:
            out.append(QueueRange(q.topic, q.broker, q.queue_id, start, end))
    return out


def split_ranges(ranges: list[QueueRange], min_partitions: int | None) -> list[QueueRange]:
    """`ranges`, the large ones cut in parts, so that there are at least `min_partitions`.

    Kafka's rule: with fewer ranges than asked, each range gets parts in proportion to
    its share of all offsets (at least one), cut into equal pieces; a range never
    becomes pieces of less than one offset. Otherwise the ranges stay as they are.
    """
    if not min_partitions or len(ranges) >= min_partitions:
        return ranges
    total = sum(r.end - r.start for r in ranges)
    out = []
    for r in ranges:
        size = r.end - r.start
        parts = min(size, max(1, round(size / total * min_partitions)))
        cuts = [r.start + size * i // parts for i in range(parts + 1)]
        out += [QueueRange(r.topic, r.broker, r.queue_id, a, b)
                for a, b in zip(cuts, cuts[1:], strict=False)]
    return out
