"""The streaming reader: per-queue offsets as the stream's offsets, checkpointed by Spark.

An offset of the stream is JSON `{"<broker>": {"<queue_id>": next_offset}}`
for every queue of the topic. Spark writes each micro-batch's end offsets to
its checkpoint before running it, so a query restarted from the checkpoint
re-runs an unfinished batch over the same ranges and continues exactly where
it left. A queue that appears later (a broker or queues added) joins at its
earliest offset. `maxOffsetsPerTrigger` bounds a micro-batch: the rows are
shared among the queues in proportion to their backlog.
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

import pyarrow as pa
from ferry.errors import OffsetOutOfRangeError
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from ferry_spark.errors import SourceOptionError
from ferry_spark.source.batch import bounds_of, read_partition
from ferry_spark.source.options import ReadOptions
from ferry_spark.source.ranges import QueueBounds, QueueRange, check_in_range

Positions = dict[tuple[str, int], int]


def to_offset(positions: Positions) -> dict[str, dict[str, int]]:
    """Positions as the stream's JSON offset (sorted, so equal offsets print equal)."""
    out: dict[str, dict[str, int]] = {}
    for (broker, qid), offset in sorted(positions.items()):
        out.setdefault(broker, {})[str(qid)] = offset
    return out


def from_offset(offset: Mapping[str, object]) -> Positions:
    """The stream's JSON offset as positions; a malformed one raises SourceOptionError."""
    out: Positions = {}
    try:
        for broker, queues in offset.items():
            for qid, value in dict(queues).items():  # type: ignore[call-overload]
                out[(str(broker), int(qid))] = int(value)
    except (TypeError, ValueError, AttributeError):
        raise SourceOptionError(f"ferry source: malformed stream offset {offset!r}") from None
    return out


def share_rows(start: Positions, end: Positions, max_rows: int) -> Positions:
    """`end` cut so that at most `max_rows` offsets are read past `start`, in proportion
    to each queue's backlog (what rounding leaves goes one by one, so a batch always moves)."""
    backlog = {k: end[k] - start.get(k, end[k]) for k in end}
    backlog = {k: n for k, n in backlog.items() if n > 0}
    total = sum(backlog.values())
    if total <= max_rows:
        return dict(end)
    out = dict(end)
    given = 0
    for k in sorted(backlog):
        share = backlog[k] * max_rows // total
        out[k] = start[k] + share
        given += share
    for k in sorted(backlog):
        if given >= max_rows:
            break
        if out[k] < end[k]:
            out[k] += 1
            given += 1
    return out


class FerryStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """`spark.readStream.format("ferry")`: a topic's new messages, micro-batch by micro-batch."""

    def __init__(self, opts: ReadOptions) -> None:
        self.opts = opts
        self._target: Positions | None = None   # Trigger.AvailableNow: read no further

    def _bounds(self) -> dict[tuple[str, int], QueueBounds]:
        return {(q.broker, q.queue_id): q for q in bounds_of(self.opts)}

    def initialOffset(self) -> dict:
        o = self.opts
        positions: Positions = {}
        for key, q in self._bounds().items():
            start = q.start_at_time if q.start_at_time is not None \
                else o.starting.for_queue(*key)
            if start == -2:
                start = q.min_offset
            elif start == -1:
                start = q.max_offset
            positions[key] = check_in_range(o.topic, q, start, "starting", o.fail_out_of_range)
        return to_offset(positions)

    def getDefaultReadLimit(self) -> ReadLimit:
        n = self.opts.max_offsets_per_trigger
        return ReadMaxRows(n) if n else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = {k: q.max_offset for k, q in self._bounds().items()}

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        begin = from_offset(start)
        end: Positions = dict(begin)   # queues gone from the route keep their position
        for key, q in self._bounds().items():
            if key not in begin:
                end[key] = q.min_offset   # a new queue joins at its earliest offset
                continue
            top = q.max_offset if self._target is None else \
                min(q.max_offset, self._target.get(key, q.max_offset))
            if top < begin[key]:
                if self.opts.fail_out_of_range:
                    raise OffsetOutOfRangeError(
                        f"ferry source: {self.opts.topic} {key[0]}/{key[1]} ends at "
                        f"{q.max_offset}, before the stream's position {begin[key]} (was the "
                        f"broker's data lost?)")
                top = begin[key]
            end[key] = top
        if isinstance(limit, ReadMaxRows):
            end = share_rows(begin, end, limit.max_rows)
        return to_offset(end)

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        begin, stop = from_offset(start), from_offset(end)
        return [QueueRange(self.opts.topic, broker, qid, begin[(broker, qid)], offset)
                for (broker, qid), offset in sorted(stop.items())
                if (broker, qid) in begin and offset > begin[(broker, qid)]]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        yield from read_partition(self.opts, partition)

    def commit(self, end: dict) -> None:
        """Nothing to do: the source keeps no state of its own (Spark's checkpoint has it)."""
