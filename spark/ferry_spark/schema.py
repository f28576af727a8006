"""The fixed schema of the `ferry` data source, and records turned into its Arrow batches.

Every read (network or store directory, batch or stream) yields these columns
in this order. Rows are built as Arrow record batches, one per pulled chunk:
Spark takes them without a Python object per value.
"""
from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
from ferry.client.message import ConsumerRecord
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

SCHEMA = StructType([
    StructField("topic", StringType(), False),
    StructField("broker", StringType(), False),
    StructField("queue_id", IntegerType(), False),
    StructField("queue_offset", LongType(), False),
    StructField("msg_id", StringType(), False),
    StructField("key", StringType(), True),        # the message's keys joined by a space
    StructField("tags", StringType(), True),
    StructField("properties", MapType(StringType(), StringType(), True), False),
    StructField("body", BinaryType(), False),
    StructField("born_ts", TimestampType(), False),
    StructField("store_ts", TimestampType(), False),
    StructField("reconsume_times", IntegerType(), False),
])

#: The same columns as Arrow types (timestamps in microseconds, UTC, as Spark keeps them).
ARROW_SCHEMA = pa.schema([
    pa.field("topic", pa.string(), False),
    pa.field("broker", pa.string(), False),
    pa.field("queue_id", pa.int32(), False),
    pa.field("queue_offset", pa.int64(), False),
    pa.field("msg_id", pa.string(), False),
    pa.field("key", pa.string(), True),
    pa.field("tags", pa.string(), True),
    pa.field("properties", pa.map_(pa.string(), pa.string()), False),
    pa.field("body", pa.binary(), False),
    pa.field("born_ts", pa.timestamp("us", tz="UTC"), False),
    pa.field("store_ts", pa.timestamp("us", tz="UTC"), False),
    pa.field("reconsume_times", pa.int32(), False),
])

_US_PER_MS = 1000
_TIMESTAMP = pa.timestamp("us", tz="UTC")
_PROPERTIES = pa.map_(pa.string(), pa.string())


def _properties(records: Sequence[ConsumerRecord]) -> pa.Array:
    """The properties column, built from flat keys, values and offsets: pa.array over
    lists of pairs costs ~40 us a record, this a tenth of it."""
    offsets = [0]
    keys: list[str] = []
    values: list[str] = []
    for r in records:
        props = r.properties
        keys += props.keys()
        values += props.values()
        offsets.append(len(keys))
    return pa.MapArray.from_arrays(pa.array(offsets, pa.int32()), pa.array(keys, pa.string()),
                                   pa.array(values, pa.string()), type=_PROPERTIES)


def _timestamps(ms: list[int]) -> pa.Array:
    # int64 microseconds viewed as timestamps: converting Python ints straight to a
    # timestamp array is several times slower.
    return pa.array([t * _US_PER_MS for t in ms], pa.int64()).view(_TIMESTAMP)


def to_batch(records: Sequence[ConsumerRecord], topic: str) -> pa.RecordBatch:
    """The Arrow batch of `records` (all read from `topic`, the stored topic)."""
    n = len(records)
    columns = [
        pa.array([topic] * n, pa.string()),
        pa.array([r.broker for r in records], pa.string()),
        pa.array([r.queue_id for r in records], pa.int32()),
        pa.array([r.queue_offset for r in records], pa.int64()),
        pa.array([r.msg_id for r in records], pa.string()),
        pa.array([" ".join(r.keys) or None for r in records], pa.string()),
        pa.array([r.tags for r in records], pa.string()),
        _properties(records),
        pa.array([r.body for r in records], pa.binary()),
        _timestamps([r.born_ts_ms for r in records]),
        _timestamps([r.store_ts_ms for r in records]),
        pa.array([r.reconsume_times for r in records], pa.int32()),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=ARROW_SCHEMA)
