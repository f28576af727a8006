"""The tracing hook: a `store` span for every TRACED message the put wrote.

An after-put hook (see `put_pipeline`), installed only while tracing is on
(FERRY_TRACING=off: not in the pipeline at all). It looks at a message only when its
flags carry `MessageFlag.TRACED`, so an untraced put costs one flag test per
decoded message, and nothing at all on the fast path (a SEND whose frame does
not announce TRACED: `PutDone.traced_body` is None). For a traced message it
reads the W3C context from the message's properties and makes a span child of
it with where the message went: `ferry.broker`, the queue
(`messaging.destination.partition.id`) and `ferry.queue_offset`.

The hop is `store`, or `half` (SERVER kind) for a transaction's half stored in
`%HALF%`. The span marks the moment the store wrote the record: it starts and
ends in this hook, which runs first of the after-put hooks (last in the list),
so the durability and replication waits are not in it.
"""
from __future__ import annotations

from collections.abc import Iterator

from ferry.codec import ENTRY_HEAD, ENTRY_HEAD_SIZE, MessageFlag, msg_id_hex
from ferry.names import HALF_TOPIC
from ferry.store import decode_properties
from ferry.telemetry import extract, hop_span, tracing
from opentelemetry.trace import SpanKind

from ferry_broker.put_pipeline import PutDone, PutHook

_TRACED = int(MessageFlag.TRACED)
# Span attribute names beyond the ones hop_span sets itself.
PARTITION = "messaging.destination.partition.id"
BROKER = "ferry.broker"
QUEUE_OFFSET = "ferry.queue_offset"
BODY_SIZE = "messaging.message.body.size"


class TracedEntry:
    """One traced message as the hook reads it from a put (decoded or fast path)."""

    __slots__ = ("body_size", "msg_id", "properties", "queue_id", "queue_offset", "topic")

    def __init__(self, topic: str, queue_id: int, queue_offset: int, msg_id: str,
                 properties: bytes | memoryview, body_size: int) -> None:
        self.topic = topic
        self.queue_id = queue_id
        self.queue_offset = queue_offset
        self.msg_id = msg_id
        self.properties = properties
        self.body_size = body_size


def traced_entries(done: PutDone) -> Iterator[TracedEntry]:
    """The TRACED messages of a put, with where each was stored."""
    if done.messages is not None and done.results is not None:
        for msg, res in zip(done.messages, done.results, strict=True):
            if msg.flags & _TRACED:
                yield TracedEntry(msg.topic, msg.queue_id, res.queue_offset,
                                  msg_id_hex(res.msg_id), msg.properties, len(msg.body))
        return
    if done.traced_body is None or done.batch is None:
        return
    # The fast path: walk the SEND body's entry heads (validated by the store already)
    # and decode nothing but a traced entry's properties.
    data, topic, queue_id = done.traced_body
    unpack_from = ENTRY_HEAD.unpack_from
    pos, i, end = 0, 0, len(data)
    first = done.batch.first_queue_offset
    while pos < end:
        length, msg_id, _born, flags, tags_len, keys_len, props_len, body_len = (
            unpack_from(data, pos))
        if flags & _TRACED:
            at = pos + ENTRY_HEAD_SIZE + tags_len + keys_len
            yield TracedEntry(topic, queue_id, first + i, msg_id_hex(msg_id),
                              data[at:at + props_len], body_len)
        pos += length
        i += 1


class TraceHook(PutHook):
    """Makes the broker's `store` (or `half`) span of each traced message of a put."""

    traced_only = True  # a fast-path put that announced no TRACED entry has no span

    def __init__(self, broker_name: str) -> None:
        self._broker = broker_name

    async def after_put(self, done: PutDone) -> None:
        if done.messages is None and done.traced_body is None:
            return  # the fast path of a SEND that announced no TRACED entry
        if not tracing().enabled:  # shut down since (the broker is stopping)
            return
        for entry in traced_entries(done):
            try:
                props = decode_properties(bytes(entry.properties))
            except Exception:  # noqa: BLE001 - stored already; a bad property only loses a span
                continue
            half = entry.topic == HALF_TOPIC
            with hop_span("half" if half else "store", destination=entry.topic,
                          msg_id=entry.msg_id, parent=extract(props),
                          kind=SpanKind.SERVER if half else None,
                          attributes={BROKER: self._broker, PARTITION: str(entry.queue_id),
                                      QUEUE_OFFSET: entry.queue_offset,
                                      BODY_SIZE: entry.body_size}):
                pass
