"""The streaming reader: per-queue offsets as the stream's offsets, checkpointed by Spark.

An offset of the stream is JSON
`{"<topic>": {"<broker>": {"<queue_id>": next_offset}}}` for every queue of
the topics read (a checkpoint written before multi-topic reads, without the
topic level, is read as the one topic's). Spark writes each micro-batch's end
offsets to its checkpoint before running it, so a query restarted from the
checkpoint re-runs an unfinished batch over the same ranges and continues
exactly where it left. A queue that appears later (a broker or queues added,
a new topic matching `topicPattern`) joins at its earliest offset.
`maxOffsetsPerTrigger` bounds a micro-batch: the rows are shared among the
queues in proportion to their backlog.

With `groupId`, the group's offsets at the brokers follow the query, so
`ferry group lag` shows its progress: `commit(end)` (Spark has finished every
batch up to `end`) commits `end`. Spark calls it only when it plans the NEXT
batch, so the last batch before a pause (or the end of `Trigger.AvailableNow`)
would stay uncommitted; `latestOffset(start)` therefore commits `start` too:
Spark runs one batch at a time and asks for the next one's end only once the
batch ending at `start` is done (a batch left unfinished by a stop is re-run
from the checkpoint before any `latestOffset`), so `start` is always read.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator, Mapping, Sequence

import pyarrow as pa
from ferry.auth.credentials import Credentials
from ferry.client.core.connection import ConnectionPool
from ferry.client.core.message import TopicQueue
from ferry.client.core.namesrv import NamesrvClient, RouteCache
from ferry.client.core.offsets import RemoteOffsetStore
from ferry.errors import FerryError, OffsetOutOfRangeError
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from ferry_spark.errors import SourceOptionError
from ferry_spark.source.batch import bounds_of, read_partition
from ferry_spark.source.options import ReadOptions, signing_credentials
from ferry_spark.source.ranges import QueueBounds, QueueRange, check_in_range, split_ranges

log = logging.getLogger(__name__)

#: (topic, broker, queue_id) -> the next offset to read
Positions = dict[tuple[str, str, int], int]


def to_offset(positions: Positions) -> dict[str, dict[str, dict[str, int]]]:
    """Positions as the stream's JSON offset (sorted, so equal offsets print equal)."""
    out: dict[str, dict[str, dict[str, int]]] = {}
    for (topic, broker, qid), offset in sorted(positions.items()):
        out.setdefault(topic, {}).setdefault(broker, {})[str(qid)] = offset
    return out


def from_offset(offset: Mapping[str, object], topic: str | None = None) -> Positions:
    """The stream's JSON offset as positions; a malformed one raises SourceOptionError.

    An offset of the older form `{"<broker>": {"<queue_id>": n}}` is `topic`'s."""
    out: Positions = {}
    try:
        for outer, inner in offset.items():
            inner = dict(inner)  # type: ignore[call-overload]
            if inner and not any(isinstance(v, Mapping) for v in inner.values()):
                if topic is None:
                    raise ValueError("a broker-level offset of a multi-topic read")
                inner = {outer: inner}
                outer = topic
            for broker, queues in inner.items():
                for qid, value in dict(queues).items():
                    out[(str(outer), str(broker), int(qid))] = int(value)
    except (TypeError, ValueError, AttributeError):
        raise SourceOptionError(f"ferry source: malformed stream offset {offset!r}") from None
    return out


async def _commit(namesrv: str, group: str, positions: Positions, request_timeout_ms: int,
                  credentials: Credentials | None) -> None:
    client = NamesrvClient(namesrv, credentials=credentials)
    pool = ConnectionPool(request_timeout_ms=request_timeout_ms, credentials=credentials)
    try:
        store = RemoteOffsetStore(pool, RouteCache(client, refresh_interval_ms=0), group)
        await store.commit({TopicQueue(*key): offset for key, offset in positions.items()})
    finally:
        await pool.close()
        await client.close()


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
        self._committed: Positions | None = None  # what the group has, as last committed

    def _bounds(self) -> dict[tuple[str, str, int], QueueBounds]:
        return {(q.topic, q.broker, q.queue_id): q for q in bounds_of(self.opts)}

    def _positions(self, offset: Mapping[str, object]) -> Positions:
        o = self.opts
        return from_offset(offset, o.topics[0] if len(o.topics) == 1 else None)

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
            positions[key] = check_in_range(q, start, "starting", o.fail_out_of_range)
        return to_offset(positions)

    def getDefaultReadLimit(self) -> ReadLimit:
        n = self.opts.max_offsets_per_trigger
        return ReadMaxRows(n) if n else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = {k: q.max_offset for k, q in self._bounds().items()}

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        begin = self._positions(start)
        self._commit(begin)   # the batch that ended at `start` is done (module doc)
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
                        f"ferry source: {key[0]} {key[1]}/{key[2]} ends at "
                        f"{q.max_offset}, before the stream's position {begin[key]} (was the "
                        f"broker's data lost?)")
                top = begin[key]
            end[key] = top
        if isinstance(limit, ReadMaxRows):
            end = share_rows(begin, end, limit.max_rows)
        return to_offset(end)

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        begin, stop = self._positions(start), self._positions(end)
        return split_ranges([QueueRange(*key, begin[key], offset)
                             for key, offset in sorted(stop.items())
                             if key in begin and offset > begin[key]], self.opts.min_partitions)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        yield from read_partition(self.opts, partition)

    def commit(self, end: dict) -> None:
        """With `groupId`: `end` as the group's committed offsets at the brokers.

        Spark's checkpoint stays the stream's truth (a restart reads from it, not
        from the group), so a failed commit is logged and the query goes on; the
        next batch's commit brings the group up to date.
        """
        self._commit(self._positions(end))

    def _commit(self, positions: Positions) -> None:
        o = self.opts
        if o.group_id is None or o.namesrv is None or positions == self._committed:
            return
        try:
            asyncio.run(_commit(o.namesrv, o.group_id, positions, o.request_timeout_ms,
                                signing_credentials(o.credentials)))
            self._committed = positions
        except (FerryError, OSError) as exc:
            log.warning("ferry source: committing group %s's offsets failed: %s", o.group_id, exc)
