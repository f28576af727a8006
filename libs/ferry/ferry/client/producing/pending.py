"""What waits in a producer's batch: the three entry kinds, each with its own behaviour.

An entry is one message (`PendingMessage`, from `send` with options), the
messages of one `send_batch` call (`PendingGroup`: one future for all), or
plain messages queued back to back by `send` (`PendingRun`: no object per
message, see `accumulator`). The sender treats them alike through the same
methods: `live()` (anything left to send), `body_parts()` (its SEND-batch
bytes), `split()` (what a failed SEND retries), `complete()` and
`complete_each()` (resolve futures from the answer), `cancel()`.

Every entry is encoded into its SEND-batch bytes once: a message and a group
when queued, a run when its batch goes out (`PendingRun.encode`).
"""
from __future__ import annotations

import asyncio
from asyncio import Future, InvalidStateError
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any

from ferry.client.core.message import SendResult, TopicQueue
from ferry.codec.entry import ENTRY_HEAD_SIZE, append_plain_entries
from ferry.wire import WireMessage, encode_messages

# ENTRY_HEAD ("<I16sqIHHII") in two pieces around the 16-byte id, for PendingRun.encode.
#: Builds a SendResult without the NamedTuple's Python-level __new__ (a fourth of its cost):
#: `_result(SendResult, (msg_id, topic, queue_id, queue_offset, broker))`.
_result = tuple.__new__
_hex, _upper = bytes.hex, str.upper
_SET_RESULT = Future.set_result
_FUTURE_DONE = Future.done
_consume = deque[object](maxlen=0).extend   # runs an iterator to its end, in C


def _at(offsets: Sequence[int], i: int) -> int:
    """A flagged SEND's offset of its `i`th message (-1: delayed, not stored yet)."""
    return int(offsets[i]) if i < len(offsets) else -1


@dataclass(slots=True)
class PendingMessage:
    """A message waiting in a batch, with the future its sender awaits and its retry count."""

    wire: WireMessage
    future: asyncio.Future[object]
    topic: str
    attempts: int = 0
    key: str | None = None
    ordered: bool = False
    encoded: bytes = b""   # its SEND-batch entry; encoded here when not given
    priority: int = 0      # kept when a failed send moves it to another queue (of its level)

    def __post_init__(self) -> None:
        if not self.encoded:
            self.encoded = encode_messages([self.wire])

    @property
    def size_bytes(self) -> int:
        return len(self.encoded)

    @property
    def count(self) -> int:
        return 1

    @property
    def flags(self) -> int:
        return self.wire.flags

    def live(self) -> bool:
        """Whether it is still to send (its future was not cancelled)."""
        return not self.future.done()

    def body_parts(self) -> list[bytes]:
        return [self.encoded]

    def split(self, topic: str) -> list[Pending]:
        return [self]

    def complete(self, tq: TopicQueue, queue_id: int, first: int) -> None:
        """Resolve the future: stored at queue offset `first` (-1: unknown)."""
        if not self.future.done():
            self.future.set_result(_result(SendResult, (
                self.wire.msg_id.hex().upper(), tq.topic, queue_id, first, tq.broker)))

    def complete_each(self, tq: TopicQueue, queue_id: int, offsets: Sequence[int],
                      i: int) -> None:
        """Resolve the future from a flagged SEND's per-message `offsets` (its own at `i`)."""
        if not self.future.done():
            self.future.set_result(SendResult(self.wire.msg_id.hex().upper(), tq.topic,
                                              queue_id, _at(offsets, i), tq.broker))

    def cancel(self) -> None:
        if not self.future.done():
            self.future.cancel()


@dataclass(slots=True)
class PendingGroup:
    """The messages of one `send_batch` call: one entry, one future, always in one frame.

    The future resolves to the list of their SendResults; `msg_ids` are their
    16-byte ids in order, `encoded` their SEND-batch entries back to back, or
    (from `send_batch`) `parts` the pieces of those entries and `nbytes` their
    size, joined only into the frame that carries them: a frame of several
    groups then copies each body once.
    """

    msg_ids: list[bytes]
    encoded: bytes
    future: asyncio.Future[object]
    topic: str
    first_body: bytes = b""    # what a queue selector sees when the group is sent again
    attempts: int = 0
    key: str | None = None
    ordered: bool = False
    flags: int = 0             # the OR of its messages' flags
    priority: int = 0          # its first message's: kept when moved to another queue
    parts: list[bytes] = field(default_factory=list)
    nbytes: int = 0            # the size of `parts` (when given)

    @property
    def size_bytes(self) -> int:
        return self.nbytes if self.parts else len(self.encoded)

    @property
    def count(self) -> int:
        return len(self.msg_ids)

    def live(self) -> bool:
        return not self.future.done()

    def body_parts(self) -> list[bytes]:
        return self.parts or [self.encoded]

    def split(self, topic: str) -> list[Pending]:
        return [self]   # a group always travels in one frame, retried as a whole

    def results(self, tq: TopicQueue, queue_id: int, first: int) -> list[SendResult]:
        """The SendResults of the group stored from queue offset `first` (-1: unknown)."""
        topic, broker = tq.topic, tq.broker
        if first < 0:
            return [_result(SendResult, (m.hex().upper(), topic, queue_id, -1, broker))
                    for m in self.msg_ids]
        return [_result(SendResult, (m.hex().upper(), topic, queue_id, offset, broker))
                for m, offset in zip(self.msg_ids, range(first, first + len(self.msg_ids)),
                                     strict=True)]

    def complete(self, tq: TopicQueue, queue_id: int, first: int) -> None:
        if not self.future.done():
            self.future.set_result(self.results(tq, queue_id, first))

    def complete_each(self, tq: TopicQueue, queue_id: int, offsets: Sequence[int],
                      i: int) -> None:
        if not self.future.done():
            ids = b"".join(self.msg_ids).hex().upper()
            self.future.set_result([
                SendResult(ids[32 * k:32 * k + 32], tq.topic, queue_id, _at(offsets, i + k),
                           tq.broker) for k in range(self.count)])

    def cancel(self) -> None:
        if not self.future.done():
            self.future.cancel()


#: What a failed SEND's entries become for a retry: each keeps its id and bytes.
Pending = PendingMessage | PendingGroup


class PendingRun:
    """Plain messages queued back to back on one queue by `send`: one entry, a future each.

    `bodies` and `futures` grow until the batch closes; `parts` (the pieces of
    their SEND-batch entries) and `msg_ids` are made once, by `encode`, when the
    batch goes out, and joined only into the frame. Never retried as a run: a
    failed run is split into `PendingMessage`s (`split`).
    """

    __slots__ = ("bodies", "futures", "born_ts_ms", "size_bytes", "parts", "msg_ids")
    flags = 0   # plain messages only

    def __init__(self, born_ts_ms: int) -> None:
        self.bodies: list[bytes] = []
        self.futures: list[asyncio.Future[object]] = []
        self.born_ts_ms = born_ts_ms
        self.size_bytes = 0          # its encoded size, counted as messages join
        self.parts: list[bytes] = []
        self.msg_ids: list[bytes] = []   # made with `parts`

    @property
    def count(self) -> int:
        return len(self.futures)

    def live(self) -> bool:
        """Drop the messages whose future is already done (cancelled) before it is encoded;
        whether any is left to send."""
        futures = self.futures
        if not self.msg_ids and _any_done(futures):
            keep = [i for i, f in enumerate(futures) if not f.done()]
            self.bodies = [self.bodies[i] for i in keep]
            self.futures = [futures[i] for i in keep]
        return bool(self.futures)

    def encode(self) -> list[bytes]:
        """The SEND-batch entries of the run's messages as pieces to join, made (with their
        ids) once (`ferry.codec.entry.append_plain_entries`, the producer's hot loop)."""
        if not self.msg_ids:
            msg_ids: list[bytes] = []
            parts: list[bytes] = []
            append_plain_entries(parts, msg_ids, self.bodies, self.born_ts_ms)
            self.msg_ids = msg_ids
            self.parts = parts
        return self.parts

    body_parts = encode

    def split(self, topic: str) -> list[Pending]:
        """One `PendingMessage` per message still waiting, each with its id and bytes."""
        encoded = b"".join(self.encode())
        out: list[Pending] = []
        start = 0
        for body, msg_id, fut in zip(self.bodies, self.msg_ids, self.futures, strict=True):
            end = start + ENTRY_HEAD_SIZE + len(body)
            if not fut.done():
                out.append(PendingMessage(WireMessage(body, msg_id, self.born_ts_ms), fut, topic,
                                          encoded=encoded[start:end]))
            start = end
        return out

    def complete(self, tq: TopicQueue, queue_id: int, first: int) -> None:
        """Resolve the futures: the messages were stored from queue offset `first` (-1: unknown).

        The SendResults are built and handed over by C-level iteration (`map`),
        the run's hottest loop; a future cancelled meanwhile (or a loop whose
        futures are no asyncio.Future) takes the careful loop instead.
        """
        topic, broker = tq.topic, tq.broker
        count = len(self.futures)
        offsets = range(first, first + count) if first >= 0 else repeat(-1, count)
        results = map(_result, repeat(SendResult), zip(
            map(_upper, map(_hex, self.msg_ids)), repeat(topic), repeat(queue_id), offsets,
            repeat(broker)))
        try:
            _consume(map(_SET_RESULT, self.futures, results))
            return
        except (InvalidStateError, TypeError):
            pass
        offsets = range(first, first + count) if first >= 0 else repeat(-1, count)
        for msg_id, fut, offset in zip(self.msg_ids, self.futures, offsets):  # noqa: B905
            if not fut.done():
                fut.set_result(_result(SendResult, (msg_id.hex().upper(), topic, queue_id,
                                                    offset, broker)))

    def complete_each(self, tq: TopicQueue, queue_id: int, offsets: Sequence[int],
                      i: int) -> None:
        for k, (msg_id, fut) in enumerate(zip(self.msg_ids, self.futures, strict=True)):
            if not fut.done():
                fut.set_result(SendResult(msg_id.hex().upper(), tq.topic, queue_id,
                                          _at(offsets, i + k), tq.broker))

    def cancel(self) -> None:
        for fut in self.futures:
            if not fut.done():
                fut.cancel()


def _any_done(futures: list[asyncio.Future[object]]) -> bool:
    try:   # the C method over the list: a few ns per future
        return any(map(_FUTURE_DONE, futures))
    except TypeError:   # a loop whose futures are no asyncio.Future
        return any(f.done() for f in futures)


#: What a batch holds: entries as `QueueBatcher.add` and `add_plain` queued them, in order.
Entry = PendingMessage | PendingGroup | PendingRun


def live_entries(items: list[Entry]) -> list[Entry]:
    """The entries of a batch still to send: without those whose future is done (cancelled)."""
    if len(items) == 1:   # the common case: one run, or one group
        return items if items[0].live() else []
    return [it for it in items if it.live()]


def entries_body(items: list[Entry]) -> bytes:
    """The SEND body of `items`: their entries' bytes back to back, joined once."""
    if len(items) == 1:
        return b"".join(items[0].body_parts())
    parts: list[bytes] = []
    for it in items:
        parts += it.body_parts()
    return b"".join(parts)


def split_entries(items: list[Entry], topic: str) -> list[Pending]:
    """`items` as a failed SEND retries them: each run split into its messages."""
    out: list[Pending] = []
    for it in items:
        out += it.split(topic)
    return out


def complete(tq: TopicQueue, items: list[Entry], fields: Mapping[str, Any]) -> None:
    """Resolve each entry's futures from the SEND answer's `fields` (first queue offset, then
    one each; a flagged batch's `offsets`: each message's own, -1 if redirected)."""
    queue_id = int(fields.get("queue_id", tq.queue_id))
    offsets = fields.get("offsets")
    i = 0
    if offsets is not None:   # a delayed message's SendResult names the queue it was sent to
        for it in items:
            it.complete_each(tq, queue_id, offsets, i)
            i += it.count
        return
    first = int(fields.get("queue_offset", -1))
    offset = first
    for it in items:
        it.complete(tq, queue_id, offset)
        if first >= 0:
            offset += it.count
