"""The batch reader: plans one partition per queue range on the driver, pulls them in tasks.

With `pushDownPredicate=true`, `df.filter` conditions on `tags` that the broker
can take (`tags = 'a'`, `tags IN ('a', 'b')`) are pushed into the read's
filter: PULLs carry them and Spark does not evaluate them again.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator, Sequence

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, EqualTo, Filter, In, InputPartition

from ferry_spark.schema import records_batch
from ferry_spark.source import store_dir
from ferry_spark.source.options import ReadFilter, ReadOptions, signing_credentials
from ferry_spark.source.probe import topic_bounds
from ferry_spark.source.pull import READER_GROUP, RangePuller
from ferry_spark.source.ranges import QueueBounds, QueueRange, plan_ranges, split_ranges

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
    chunks: Iterator[bytes | memoryview]
    if opts.store_dir is not None:
        chunks = store_dir.read_store_range(opts.store_dir, qr,
                                            fail_out_of_range=opts.fail_out_of_range)
    else:
        assert opts.namesrv is not None
        chunks = RangePuller(qr, opts.namesrv, fail_out_of_range=opts.fail_out_of_range,
                             request_timeout_ms=opts.request_timeout_ms,
                             credentials=signing_credentials(opts.credentials),
                             group=opts.group_id or READER_GROUP,
                             filter_fields=None if opts.filter.is_all
                             else opts.filter.fields()).chunks()
    pending: list[bytes | memoryview] = []
    for records in chunks:
        if records:
            pending.append(records)
        if len(pending) >= ARROW_BATCH_CHUNKS:
            batch = records_batch(b"".join(pending), qr.topic, qr.broker, qr.end)
            pending = []
            if batch.num_rows:
                yield batch
    if pending:
        batch = records_batch(b"".join(pending), qr.topic, qr.broker, qr.end)
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
