"""The batch reader: plans one partition per queue range on the driver, pulls them in tasks."""
from __future__ import annotations

from collections.abc import Iterator, Sequence

import pyarrow as pa
from ferry.codec.record import StoredMessage
from pyspark.sql.datasource import DataSourceReader, InputPartition

from ferry_spark.schema import to_batch
from ferry_spark.source import store_dir
from ferry_spark.source.options import ReadOptions, signing_credentials
from ferry_spark.source.probe import topic_bounds
from ferry_spark.source.pull import RangePuller
from ferry_spark.source.ranges import QueueBounds, QueueRange, plan_ranges

#: Rows per Arrow batch handed to Spark: several PULL answers, since every batch
#: costs Spark a fixed overhead (an Arrow message to the JVM, its vectors loaded).
ARROW_BATCH_ROWS = 8192


def bounds_of(opts: ReadOptions) -> list[QueueBounds]:
    """The topic's queue bounds, from the mesh or the store directory."""
    start_ts, end_ts = opts.starting.timestamp_ms, opts.ending.timestamp_ms
    if opts.store_dir is not None:
        broker = store_dir.broker_name(opts.store_dir, opts.broker)
        return store_dir.store_bounds(opts.store_dir, broker, opts.topic, start_ts, end_ts)
    assert opts.namesrv is not None
    return topic_bounds(opts.namesrv, opts.topic, start_ts_ms=start_ts, end_ts_ms=end_ts,
                        request_timeout_ms=opts.request_timeout_ms,
                        credentials=signing_credentials(opts.credentials))


def read_range(opts: ReadOptions, qr: QueueRange) -> Iterator[pa.RecordBatch]:
    """A task's rows: the records of `qr` as Arrow batches (network or store directory)."""
    if opts.store_dir is not None:
        chunks = store_dir.read_store_range(opts.store_dir, qr,
                                            fail_out_of_range=opts.fail_out_of_range)
    else:
        assert opts.namesrv is not None
        chunks = RangePuller(qr, opts.namesrv, fail_out_of_range=opts.fail_out_of_range,
                             request_timeout_ms=opts.request_timeout_ms,
                             credentials=signing_credentials(opts.credentials)).chunks()
    pending: list[StoredMessage] = []
    for records in chunks:
        pending += records
        if len(pending) >= ARROW_BATCH_ROWS:
            yield to_batch(pending, qr.topic, qr.broker)
            pending = []
    if pending:
        yield to_batch(pending, qr.topic, qr.broker)


def read_partition(opts: ReadOptions, partition: InputPartition) -> Iterator[pa.RecordBatch]:
    """A task's rows. When planning found nothing to read (an empty topic or range) Spark
    still runs one task, with a plain InputPartition: it reads no rows."""
    if isinstance(partition, QueueRange):
        yield from read_range(opts, partition)


class FerryBatchReader(DataSourceReader):
    """`spark.read.format("ferry")`: every queue of a topic between two offsets (or times)."""

    def __init__(self, opts: ReadOptions) -> None:
        self.opts = opts

    def partitions(self) -> Sequence[InputPartition]:
        o = self.opts
        return plan_ranges(o.topic, bounds_of(o), o.starting, o.ending, o.fail_out_of_range)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        yield from read_partition(self.opts, partition)
