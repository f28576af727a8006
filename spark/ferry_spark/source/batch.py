"""The batch reader: plans one partition per queue range on the driver, pulls them in tasks.

With `pushDownPredicate=true`, `df.filter` conditions on `tags` that the broker
can take (`tags = 'a'`, `tags IN ('a', 'b')`) are pushed into the read's
filter: PULLs carry them and Spark does not evaluate them again.
"""
from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterable, Iterator, Sequence

import pyarrow as pa
from ferry.errors import CorruptRecordError
from pyspark.sql.datasource import DataSourceReader, EqualTo, Filter, In, InputPartition

from ferry_spark.schema import records_batch
from ferry_spark.source import store_dir
from ferry_spark.source.options import ReadFilter, ReadOptions, signing_credentials
from ferry_spark.source.probe import topic_bounds
from ferry_spark.source.pull import READER_GROUP, RangePuller
from ferry_spark.source.ranges import QueueBounds, QueueRange, plan_ranges, split_ranges

log = logging.getLogger(__name__)

#: PULL answers (or store reads) per Arrow batch handed to Spark, up to 8,192 rows:
#: every batch costs Spark a fixed overhead (an Arrow message to the JVM, its vectors
#: loaded), and building one costs a fixed numpy/Arrow overhead per column.
ARROW_BATCH_CHUNKS = 8


def bounds_of(opts: ReadOptions) -> list[QueueBounds]:
    """The queue bounds of the read's topics, from the mesh or the store directory."""
    start_ts, end_ts = opts.starting.timestamp_ms, opts.ending.timestamp_ms
    if opts.store_dir is not None:
        broker = store_dir.broker_name(opts.store_dir, opts.broker)
        return store_dir.store_bounds(opts.store_dir, broker, opts.topic, start_ts, end_ts)
    assert opts.namesrv is not None
    return topic_bounds(opts.namesrv, opts.topics, opts.topic_pattern,
                        start_ts_ms=start_ts, end_ts_ms=end_ts,
                        request_timeout_ms=opts.request_timeout_ms,
                        credentials=signing_credentials(opts.credentials))


def read_range(opts: ReadOptions, qr: QueueRange) -> Iterator[pa.RecordBatch]:
    """A task's rows: the records of `qr` as Arrow batches (network or store directory)."""
    if opts.store_dir is not None:
        yield from _batches(store_dir.read_store_range(
            opts.store_dir, qr, fail_out_of_range=opts.fail_out_of_range), qr)
        return
    # Over the network the broker is asked not to check the records (unchecked PULLs):
    # records_batch checks every one of them here anyway. A corrupt record ends that:
    # the range is read on from the start of the batch that held it with the broker's
    # check, which skips (and logs) corrupt records as it does for every reader.
    puller = _puller(opts, qr, unchecked=True)
    chunks = puller.chunks()
    try:
        yield from _batches(chunks, qr, lambda: puller.last_start)
    except _CorruptBatch as bad:
        chunks.close()
        log.warning("ferry source: %s: a corrupt record at or after offset %d (%s); reading "
                    "on from there with the broker's record check", qr.where, bad.start,
                    bad.__cause__)
        rest = QueueRange(qr.topic, qr.broker, qr.queue_id, bad.start, qr.end)
        yield from _batches(_puller(opts, rest, unchecked=False).chunks(), rest)


class _CorruptBatch(Exception):
    """records_batch found a corrupt record in the batch of chunks pulled from `start`."""

    def __init__(self, start: int) -> None:
        super().__init__(start)
        self.start = start


def _puller(opts: ReadOptions, qr: QueueRange, unchecked: bool) -> RangePuller:
    assert opts.namesrv is not None
    return RangePuller(qr, opts.namesrv, fail_out_of_range=opts.fail_out_of_range,
                       request_timeout_ms=opts.request_timeout_ms,
                       credentials=signing_credentials(opts.credentials),
                       group=opts.group_id or READER_GROUP,
                       filter_fields=None if opts.filter.is_all else opts.filter.fields(),
                       unchecked=unchecked)


def _batches(chunks: Iterator[bytes | memoryview], qr: QueueRange,
             start_of: Callable[[], int] | None = None) -> Iterator[pa.RecordBatch]:
    """Arrow batches of up to ARROW_BATCH_CHUNKS chunks each. With `start_of` (the offset
    the chunk just taken was pulled from), a corrupt record raises _CorruptBatch."""
    pending: list[bytes | memoryview] = []
    at = qr.start
    for records in chunks:
        if not records:
            continue
        if not pending and start_of is not None:
            at = start_of()
        pending.append(records)
        if len(pending) >= ARROW_BATCH_CHUNKS:
            yield from _batch(pending, qr, at, start_of is not None)
            pending = []
    if pending:
        yield from _batch(pending, qr, at, start_of is not None)


def _batch(chunks: list[bytes | memoryview], qr: QueueRange, at: int,
           retry: bool) -> Iterator[pa.RecordBatch]:
    try:
        batch = records_batch(b"".join(chunks), qr.topic, qr.broker, qr.end)
    except CorruptRecordError as exc:
        if not retry:
            raise
        raise _CorruptBatch(at) from exc
    if batch.num_rows:
        yield batch


def read_partition(opts: ReadOptions, partition: InputPartition) -> Iterator[pa.RecordBatch]:
    """A task's rows. When planning found nothing to read (an empty topic or range) Spark
    still runs one task, with a plain InputPartition: it reads no rows."""
    if isinstance(partition, QueueRange):
        yield from read_range(opts, partition)


class FerryBatchReader(DataSourceReader):
    """`spark.read.format("ferry")`: every queue of the topics between two offsets (or times)."""

    def __init__(self, opts: ReadOptions) -> None:
        self.opts = opts

    def partitions(self) -> Sequence[InputPartition]:
        o = self.opts
        return split_ranges(plan_ranges(bounds_of(o), o.starting, o.ending, o.fail_out_of_range),
                            o.min_partitions)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        yield from read_partition(self.opts, partition)


def _tag_values(f: Filter) -> list[str] | None:
    """The tags a filter on the `tags` column keeps, when the broker can take it exactly."""
    if isinstance(f, EqualTo):
        values = [f.value] if f.attribute == ("tags",) else None
    elif isinstance(f, In):
        values = list(f.value) if f.attribute == ("tags",) else None
    else:
        values = None
    if not values or not all(isinstance(v, str) and v and v.strip() == v and "|" not in v
                             and v != "*" for v in values):
        return None
    return values


def _with_tags(current: ReadFilter, tags: list[str]) -> ReadFilter | None:
    """`current` further limited to `tags` (an intersection with tags it has already);
    None when nothing is left (Spark then evaluates the filter: no row passes)."""
    if current.tags is not None:
        have = current.subscription().tags
        tags = [t for t in tags if have is None or t in have]
        if not tags:
            return None
    return dataclasses.replace(current, tags=" || ".join(sorted(set(tags))))


class FerryPushdownReader(FerryBatchReader):
    """The batch reader with `pushFilters`: a separate class because PySpark refuses any
    reader that implements it unless `spark.sql.python.filterPushdown.enabled` is true."""

    def pushFilters(self, filters: list[Filter]) -> Iterable[Filter]:  # noqa: N802
        for f in filters:
            tags = _tag_values(f)
            narrowed = None if tags is None else _with_tags(self.opts.filter, tags)
            if narrowed is None:
                yield f
            else:
                self.opts = dataclasses.replace(self.opts, filter=narrowed)
