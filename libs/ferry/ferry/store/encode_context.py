"""What the put path's staging loop shares: caches, the staging buffer, the batch being staged.

The loop in `batch_input.py` runs once per message, so everything that can be
computed once per topic, host or tag is computed here on first use and cached
(bounded), and records are encoded into one reusable staging buffer.
"""
from __future__ import annotations

import struct
from collections.abc import Callable
from typing import NamedTuple

from ferry.codec.limits import MAX_HOST_BYTES, MAX_PROPERTIES_BYTES, MAX_QUEUE_ID
from ferry.codec.record import HEADER
from ferry.codec.tags import tag_bytes_hash
from ferry.errors import MalformedRequestError, MessageTooLargeError
from ferry.names import validate_topic

from .commit_log import CommitLog
from .index_keys import key_prefix_crc
from .results import BatchPutResult, PutResult

STAGING_BYTES = 1 << 20
# A staging buffer grown past this by one huge batch is given back after it.
KEEP_STAGING_BYTES = 8 << 20
# Header + (topic, born host, store host) structs cached per prefix length.
MAX_PREFIX_FORMATS = 256
_MAX_CACHED = 100_000

PackRecord = Callable[..., None]
_new_tuple = tuple.__new__


class QueueEntries:
    """Consume-queue entries of one queue, for consecutive queue offsets."""

    __slots__ = ("first_offset", "entries")

    def __init__(self, first_offset: int, entries: list[bytes]) -> None:
        self.first_offset = first_offset
        self.entries = entries  # packed CQ_ENTRY of each record


class QueueRun(QueueEntries):
    """The records one batch adds to one queue (queued for dispatch as they are, once written)."""

    __slots__ = ("queue_id", "next_offset", "topic_b", "key_crc")

    def __init__(self, queue_id: int, first_offset: int, topic_b: bytes, key_crc: int) -> None:
        # (QueueEntries.__init__ inlined: one per batch and queue on the put path)
        self.first_offset = first_offset
        self.entries = []
        self.queue_id = queue_id
        self.next_offset = first_offset  # queue offset of the next record staged
        self.topic_b = topic_b
        self.key_crc = key_crc  # key_prefix_crc of the topic


class StageState:
    """Where a batch being staged stands: the staging buffer, the log, what it collected.

    Several runs of the loop (one per queue and born host, for `put_batch`)
    continue one state, so that a whole batch is still one staged write.
    """

    __slots__ = ("pos", "seg_start", "rel", "seals", "items", "queues")

    def __init__(self, cl: CommitLog, queues: dict[tuple[str, int], QueueRun]) -> None:
        self.pos = 0  # staging bytes used
        self.seg_start = cl.active().start_offset  # the segment the next record goes to
        self.rel = cl.write_offset - self.seg_start  # and its position in it
        # (staging position of the first record of a new segment, where the segment
        # before it gets its blank marker)
        self.seals: list[tuple[int, int]] = []
        self.items: list[tuple[int, int, int]] = []  # (index key hash, phy, store ts)
        self.queues = queues  # the runs of the batch's queues

    def staged(self, results: list[PutResult] | BatchPutResult) -> Staged:
        """The staged batch, with its results."""
        return _new_tuple(Staged, (self.pos, self.seals, self.rel, self.queues, self.items,
                                   results))


class Staged(NamedTuple):
    """A batch encoded in the staging buffer and validated, not yet written."""

    used: int  # staging bytes holding records
    seals: list[tuple[int, int]]  # (staging position, blank marker position): see StageState
    end_rel: int  # position in the last segment just past the batch
    queues: dict[tuple[str, int], QueueRun]
    items: list[tuple[int, int, int]]  # (index key hash, phy, store ts) in commit-log order
    results: list[PutResult] | BatchPutResult


class EncodeContext:
    """Caches and the staging buffer of one store's put path."""

    def __init__(self, max_message_bytes: int, store_host: str, segment_bytes: int) -> None:
        self.max_body = max_message_bytes
        self.seg_bytes = segment_bytes  # of every commit-log segment
        self.store_b = store_host.encode()
        self.topics: dict[str, tuple[bytes, int]] = {}
        self.hosts: dict[str, tuple[bytes, int]] = {}
        self.tag_bytes: dict[bytes, int] = {}
        self._prefix_formats: dict[int, PackRecord] = {}
        self.buf = bytearray(STAGING_BYTES)
        self.mv = memoryview(self.buf)

    # -- staging buffer ------------------------------------------------------------------

    def grow(self, need: int, used: int) -> tuple[bytearray, memoryview]:
        """A staging buffer of at least `need` bytes keeping the first `used`."""
        buf = bytearray(max(need, 2 * len(self.buf)))
        buf[:used] = self.mv[:used]
        self.buf, self.mv = buf, memoryview(buf)
        return buf, self.mv

    def shrink(self) -> None:
        """Give back a buffer one huge batch grew (called once the batch is written)."""
        if len(self.buf) > KEEP_STAGING_BYTES:
            self.buf = bytearray(STAGING_BYTES)
            self.mv = memoryview(self.buf)

    # -- cache misses ----------------------------------------------------------------------

    def queue(self, key: tuple[str, int], next_qoff: int) -> QueueRun:
        """A batch's first message for (topic, queue_id): check both, start its run."""
        topic, qid = key
        if type(qid) is not int or not 0 <= qid <= MAX_QUEUE_ID:
            raise MalformedRequestError(f"queue id {qid!r} is not in 0..{MAX_QUEUE_ID}")
        topic_b, key_crc = self.topic(topic)
        return QueueRun(qid, next_qoff, topic_b, key_crc)

    def topic(self, topic: str) -> tuple[bytes, int]:
        """(UTF-8, index key prefix CRC) of a valid topic name."""
        got = self.topics.get(topic)
        if got is None:
            topic_b = validate_topic(topic, allow_internal=True).encode()
            if len(self.topics) >= _MAX_CACHED:
                self.topics.clear()
            got = self.topics[topic] = (topic_b, key_prefix_crc(topic_b))
        return got

    def host(self, host: str) -> tuple[bytes, int]:
        """(UTF-8, its length) of a born host, checked against its limit."""
        got = self.hosts.get(host)
        if got is None:
            born_b = host.encode()
            if len(born_b) > MAX_HOST_BYTES:
                raise MalformedRequestError(f"born_host is longer than {MAX_HOST_BYTES} bytes")
            got = (born_b, len(born_b))
            if len(self.hosts) < _MAX_CACHED:
                self.hosts[host] = got
        return got

    def tag_bytes_hash(self, tags_b: bytes) -> int:
        """The tag hash of UTF-8 tags taken from a batch input (checked to be UTF-8)."""
        tags_b.decode()  # stored tags are decoded as text: refuse what is not UTF-8
        th = tag_bytes_hash(tags_b)
        if len(self.tag_bytes) < _MAX_CACHED:
            self.tag_bytes[tags_b] = th
        return th

    def prefix_format(self, prefix_len: int) -> PackRecord:
        """pack_into of a record header followed by its topic, born host and store host."""
        pack = self._prefix_formats.get(prefix_len)
        if pack is None:
            if len(self._prefix_formats) >= MAX_PREFIX_FORMATS:
                self._prefix_formats.clear()
            pack = struct.Struct(f"{HEADER.format}{prefix_len}s").pack_into
            self._prefix_formats[prefix_len] = pack
        return pack

    def too_large(self, body_len: int, props_len: int) -> MessageTooLargeError:
        """The error for a body or properties over their limits."""
        if body_len > self.max_body:
            return MessageTooLargeError(f"message body of {body_len} bytes exceeds {self.max_body}")
        return MessageTooLargeError(f"properties of {props_len} bytes exceed {MAX_PROPERTIES_BYTES}")
