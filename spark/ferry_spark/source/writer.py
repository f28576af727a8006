"""The writers: rows of a DataFrame sent as messages with the ferry Producer.

Columns (by name; others are ignored, so a DataFrame read from a topic can be
written to another): `body` (binary or string, required), optional `key`
(keys separated by spaces: the first is the message's key), `tags`,
`properties` (map<string,string>), `topic` (used where the `topic` option
is not given; the option wins), and the producer's send options `delayMs`,
`deliverAtMs`, `ttlMs` and `priority` (integers; null: not set).

A row with a key is sent as the producer sends an ordered keyed message
(`Producer.send(..., key, ordered=True)`): the producer's own queue choice
hashes the key over the topic's stable queue list, so every row of one key
lands in one queue, in the task's row order. Rows without a key go in chunks
of `WRITE_CHUNK_ROWS` with `send_batch` (a chunk goes to one queue, chunks
round robin over the topic's queues; one chunk per topic and priority), a
few chunks in flight. A failed send fails the task, and Spark's retry of the
task sends its rows again: at-least-once.
"""
from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field

from ferry import Message, Producer, SendResult
from ferry.client.core.namesrv import PRIORITIES
from pyspark.sql import Row
from pyspark.sql.datasource import DataSourceStreamWriter, DataSourceWriter, WriterCommitMessage
from pyspark.sql.types import (
    BinaryType,
    ByteType,
    DataType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StringType,
    StructType,
)

from ferry_spark.errors import SourceOptionError
from ferry_spark.source.options import WriteOptions, signing_credentials

log = logging.getLogger(__name__)

WRITE_CHUNK_ROWS = 500           # rows per send_batch (one frame, one queue)
MAX_CHUNKS_IN_FLIGHT = 4         # send_batch calls a task awaits at once
MAX_KEYED_IN_FLIGHT = 2000       # keyed sends a task has queued before it waits for the oldest
_STRING = StringType()
_INTEGRAL = (LongType, IntegerType, ShortType, ByteType)
_COLUMN_TYPES: dict[str, tuple[type[DataType], ...]] = {
    "body": (BinaryType, StringType), "key": (StringType,), "tags": (StringType,),
    "properties": (MapType,), "topic": (StringType,), "delayMs": _INTEGRAL,
    "deliverAtMs": _INTEGRAL, "ttlMs": _INTEGRAL, "priority": _INTEGRAL}


@dataclass
class FerryCommit(WriterCommitMessage):
    """What one task sent: messages per topic."""

    sent: dict[str, int] = field(default_factory=dict)


def check_columns(schema: StructType, opts: WriteOptions) -> list[str]:
    """The message columns of `schema`, checked; raises SourceOptionError naming the problem."""
    names = {f.name: f.dataType for f in schema.fields}
    if "body" not in names:
        raise SourceOptionError("ferry sink: the DataFrame needs a body column (binary or string)")
    for name, dtype in names.items():
        allowed = _COLUMN_TYPES.get(name)
        if allowed is None:
            continue
        if not isinstance(dtype, allowed) or (isinstance(dtype, MapType) and (
                dtype.keyType != _STRING or dtype.valueType != _STRING)):
            raise SourceOptionError(f"ferry sink: column {name} has type {dtype.simpleString()}; "
                                    f"expected {' or '.join(a().simpleString() for a in allowed)}"
                                    f"{'<string,string>' if name == 'properties' else ''}")
    if opts.topic is None and "topic" not in names:
        raise SourceOptionError("ferry sink: give the topic option or a topic column")
    return [n for n in names if n in _COLUMN_TYPES]


def to_message(row: Row) -> Message:
    """The message of one row (columns as in the module doc)."""
    data = row.asDict()
    body = data.get("body")
    if body is None:
        raise SourceOptionError("ferry sink: a row has a null body")
    if isinstance(body, str):
        body = body.encode()
    keys = (data.get("key") or "").split()
    props = data.get("properties") or {}
    priority = data.get("priority") or 0
    if not 0 <= priority < PRIORITIES:
        raise SourceOptionError(f"ferry sink: a row has priority {priority}; "
                                f"expected 0..{PRIORITIES - 1} (3 highest) or null")
    return Message(body=bytes(body), key=keys[0] if keys else None, keys=tuple(keys[1:]),
                   tags=data.get("tags") or None,
                   properties={str(k): str(v) for k, v in props.items() if v is not None},
                   delay_ms=data.get("delayMs"), deliver_at_ms=data.get("deliverAtMs"),
                   ttl_ms=data.get("ttlMs"), priority=priority)


async def _send_keyed(producer: Producer, topic: str, m: Message) -> asyncio.Future[SendResult]:
    """Queue `m` as the producer places a keyed ordered message (its queue by the key)."""
    return await producer.send(topic, m.body, m.key, m.tags, m.properties, ordered=True,
                               keys=m.keys, delay_ms=m.delay_ms, deliver_at_ms=m.deliver_at_ms,
                               ttl_ms=m.ttl_ms, priority=m.priority)


async def _send_rows(opts: WriteOptions, rows: Iterator[Row]) -> dict[str, int]:
    sent: dict[str, int] = {}
    pending: set[asyncio.Task[object]] = set()
    chunks: dict[tuple[str, int], list[Message]] = {}
    keyed: deque[asyncio.Future[SendResult]] = deque()

    async def flush(at: tuple[str, int]) -> None:
        chunk = chunks.pop(at, [])
        if not chunk:
            return
        topic = at[0]
        while len(pending) >= MAX_CHUNKS_IN_FLIGHT:
            done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            pending.difference_update(done)
            for task in done:
                task.result()   # a failed send fails the task
        pending.add(asyncio.ensure_future(producer.send_batch(topic, chunk)))
        sent[topic] = sent.get(topic, 0) + len(chunk)

    async with Producer(namesrv=opts.namesrv, request_timeout_ms=opts.request_timeout_ms,
                        credentials=signing_credentials(opts.credentials)) as producer:
        for row in rows:
            topic = opts.topic or row["topic"]
            if not topic:
                raise SourceOptionError("ferry sink: a row has a null topic")
            msg = to_message(row)
            if msg.key:
                keyed.append(await _send_keyed(producer, topic, msg))
                sent[topic] = sent.get(topic, 0) + 1
                while len(keyed) > MAX_KEYED_IN_FLIGHT:
                    await keyed.popleft()   # a failed send fails the task
                continue
            chunk = chunks.setdefault((topic, msg.priority), [])
            chunk.append(msg)
            if len(chunk) >= WRITE_CHUNK_ROWS:
                await flush((topic, msg.priority))
        for at in list(chunks):
            await flush(at)
        for task in asyncio.as_completed(pending):
            await task
        for fut in keyed:
            await fut
    return sent


def send_rows(opts: WriteOptions, rows: Iterator[Row]) -> FerryCommit:
    """Send a task's rows; returns the counts (raises if any send failed)."""
    return FerryCommit(asyncio.run(_send_rows(opts, rows)))


def _total(messages: list[WriterCommitMessage | None]) -> dict[str, int]:
    out: dict[str, int] = {}
    for m in messages:
        if isinstance(m, FerryCommit):
            for topic, n in m.sent.items():
                out[topic] = out.get(topic, 0) + n
    return out


class FerryWriter(DataSourceWriter):
    """`df.write.format("ferry")`: every row sent as a message."""

    def __init__(self, opts: WriteOptions, schema: StructType) -> None:
        self.opts = opts
        self.columns = check_columns(schema, opts)
        self.sent: dict[str, int] = {}

    def write(self, iterator: Iterator[Row]) -> FerryCommit:
        return send_rows(self.opts, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        self.sent = _total(messages)
        log.info("ferry sink: sent %s", self.sent)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        log.warning("ferry sink: write failed after sending %s (those stay sent)",
                    _total(messages))


class FerryStreamWriter(DataSourceStreamWriter):
    """`df.writeStream.format("ferry")`: each micro-batch's rows sent as messages."""

    def __init__(self, opts: WriteOptions, schema: StructType) -> None:
        self.opts = opts
        self.columns = check_columns(schema, opts)

    def write(self, iterator: Iterator[Row]) -> FerryCommit:
        return send_rows(self.opts, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        log.info("ferry sink: batch %d sent %s", batchId, _total(messages))

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        log.warning("ferry sink: batch %d failed after sending %s (those stay sent; the batch "
                    "is sent again on retry)", batchId, _total(messages))
