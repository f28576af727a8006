"""The fixed schema of the `ferry` data source, and records turned into its Arrow batches.

Every read (network or store directory, batch or stream) yields these columns
in this order. Rows are built as Arrow record batches straight from the
stored records' bytes (`records_batch`): Spark takes them without a Python
object per record or value.
"""
from __future__ import annotations

from operator import itemgetter

import numpy as np
import pyarrow as pa
from ferry.codec.properties import decode_properties
from ferry.codec.record import HEADER_LAYOUT, HEADER_SIZE, SIZE_MAGIC_CRC, check_records
from ferry.errors import CorruptRecordError
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
_STRUCT_TO_NUMPY = {"I": "<u4", "i": "<i4", "q": "<i8", "B": "u1", "H": "<u2", "16s": "V16"}
#: The record header (ferry.codec.record.HEADER_LAYOUT) as a numpy dtype: a whole PULL
#: answer's headers are read as columns at once, not a Python object per record.
HEADER_DTYPE = np.dtype([(name, _STRUCT_TO_NUMPY[code]) for name, code in HEADER_LAYOUT])
assert HEADER_DTYPE.itemsize == HEADER_SIZE
_first = itemgetter(0)
_HEX = np.frombuffer(b"0123456789ABCDEF", np.uint8)
_PARTS_BEFORE_BODY = ("topic_len", "born_host_len", "store_host_len", "tags_len", "keys_len",
                      "props_len")


def _spans(data: pa.Buffer, starts: np.ndarray, lens: np.ndarray) -> pa.Array:
    """The byte spans [starts, starts + lens) of `data` (ascending, not overlapping) as a
    binary column, copied by Arrow's `take`.

    The spans and the gaps between them, in order, are the elements of one binary
    array over `data` itself (no copy); taking every other element copies the spans
    back to back in C++: 12 times cheaper than joining a bytes slice per record
    (256-byte bodies), which cost four times less than a numpy gather of an index
    per byte."""
    n = len(starts)
    if not n:
        return pa.array([], pa.binary())
    bounds = np.empty(2 * n, np.int64)
    bounds[0::2] = starts
    bounds[1::2] = starts + lens
    if bounds[-1] >= 2**31:
        raise CorruptRecordError("an Arrow batch's records exceed 2 GiB")
    whole = pa.Array.from_buffers(pa.binary(), 2 * n - 1, [
        None, pa.py_buffer(bounds.astype(np.int32)), data])
    return whole.take(pa.array(np.arange(0, 2 * n, 2, dtype=np.int32)))


def _variable(data: pa.Buffer, starts: np.ndarray, lens: np.ndarray, kind: pa.DataType,
              nullable: bool) -> pa.Array:
    """A string or binary column from spans of `data` (empty spans are nulls if `nullable`)."""
    if not lens.any():   # no record has this part (keys, tags): no copy
        if nullable:
            return pa.nulls(len(lens), kind)
        return pa.Array.from_buffers(kind, len(lens), [
            None, pa.py_buffer(np.zeros(len(lens) + 1, np.int32)), pa.py_buffer(b"")])
    out = _spans(data, starts, lens)
    if nullable:
        present = lens > 0
        nulls = int(len(lens) - present.sum())
        if nulls:
            validity = pa.py_buffer(np.packbits(present, bitorder="little").tobytes())
            _, offsets, values = out.buffers()
            out = pa.Array.from_buffers(pa.binary(), len(lens), [validity, offsets, values],
                                        null_count=nulls)
    if kind == pa.string():
        out = out.view(pa.string())
        out.validate(full=True)   # UTF-8, as the record decoder insists
    return out


def _msg_ids(h: np.ndarray) -> pa.Array:
    """The 16-byte ids as 32 upper-case hex characters, for all records at once."""
    raw = np.ascontiguousarray(h["msg_id"]).view(np.uint8).reshape(len(h), 16)
    chars = np.empty((len(h), 32), np.uint8)
    chars[:, 0::2] = _HEX[raw >> 4]
    chars[:, 1::2] = _HEX[raw & 15]
    offsets = np.arange(0, 32 * len(h) + 1, 32, dtype=np.int32)
    return pa.Array.from_buffers(pa.string(), len(h), [None, pa.py_buffer(offsets.tobytes()),
                                                       pa.py_buffer(chars.tobytes())])


def _properties(data: bytes, starts: np.ndarray, lens: np.ndarray) -> pa.Array:
    """The properties column. Records without properties cost no Python work (their
    maps are empty spans of the offsets, built at once); the others are decoded once
    per distinct encoding (a producer's messages often carry the same properties)."""
    counts = np.zeros(len(lens), np.int32)
    keys: list[str] = []
    values: list[str] = []
    has = np.flatnonzero(lens)
    if len(has):
        decoded: dict[bytes, dict[str, str]] = {}
        for i, start, n in zip(has.tolist(), starts[has].tolist(), lens[has].tolist(),
                               strict=True):
            raw = data[start:start + n]
            props = decoded.get(raw)
            if props is None:
                props = decoded[raw] = decode_properties(raw)
            keys += props.keys()
            values += props.values()
            counts[i] = len(props)
    offsets = np.zeros(len(lens) + 1, np.int32)
    np.cumsum(counts, out=offsets[1:])
    return pa.MapArray.from_arrays(pa.array(offsets), pa.array(keys, pa.string()),
                                   pa.array(values, pa.string()), type=_PROPERTIES)


def _timestamps(ms: np.ndarray) -> pa.Array:
    return pa.array(ms.astype(np.int64) * _US_PER_MS, pa.int64()).view(_TIMESTAMP)


def _constant(value: str, n: int) -> pa.Array:
    return pa.array([value], pa.string()).take(pa.array(np.zeros(n, np.int32)))


def records_batch(records: bytes | memoryview, topic: str, broker: str, end: int | None = None
                  ) -> pa.RecordBatch:
    """The Arrow batch of stored records back to back (PULL answers, store reads) read
    from `topic` at `broker`; records at queue offsets >= `end` are left out.

    Columnar: every record is checked (magic, size, CRC: `check_records`), then the
    headers are gathered into a numpy array and each column is cut from the buffer
    at once; only properties are decoded per record, and only where there are any.
    """
    if type(records) is not bytes:
        records = bytes(records)
    view = memoryview(records)
    sizes = list(map(_first, check_records(view, 0, len(view), SIZE_MAGIC_CRC)))
    if not sizes:
        return pa.RecordBatch.from_pylist([], schema=ARROW_SCHEMA)
    data = pa.py_buffer(records)
    starts = np.zeros(len(sizes), np.int64)
    np.cumsum(sizes[:-1], out=starts[1:])
    headers = _spans(data, starts, np.full(len(sizes), HEADER_SIZE, np.int64))
    h = np.frombuffer(headers.buffers()[2], HEADER_DTYPE, len(sizes))
    if end is not None:
        keep = h["queue_offset"] < end
        if not keep.all():
            h, starts = h[keep], starts[keep]
            if not len(h):
                return pa.RecordBatch.from_pylist([], schema=ARROW_SCHEMA)
    at = starts + HEADER_SIZE
    part: dict[str, np.ndarray] = {}
    for name in _PARTS_BEFORE_BODY:
        part[name] = at
        at = at + h[name].astype(np.int64)
    if not np.array_equal(at + h["body_len"], starts + h["total_size"]):
        raise CorruptRecordError("a record's part lengths do not add up to its size")
    n = len(h)
    columns = [
        _constant(topic, n), _constant(broker, n),
        pa.array(h["queue_id"], pa.int32()), pa.array(h["queue_offset"], pa.int64()),
        _msg_ids(h),
        _variable(data, part["keys_len"], h["keys_len"].astype(np.int64), pa.string(), True),
        _variable(data, part["tags_len"], h["tags_len"].astype(np.int64), pa.string(), True),
        _properties(records, part["props_len"], h["props_len"].astype(np.int64)),
        _spans(data, at, h["body_len"].astype(np.int64)),
        _timestamps(h["born_ts_ms"]), _timestamps(h["store_ts_ms"]),
        pa.array(h["reconsume_times"], pa.int32()),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=ARROW_SCHEMA)
