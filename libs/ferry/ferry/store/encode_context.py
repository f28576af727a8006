"""What the put path's encoding loops share: caches, the staging buffer, the staged batch.

The loops in `appender.py` (MessageIn tuples) and `batch_input.py` (the message
batch input layout) run once per message, so everything that can be computed
once per topic, host, tag or record shape is computed here on first use and
cached (bounded), and records are encoded into one reusable staging buffer.
"""
from __future__ import annotations

import struct
from collections.abc import Callable
from typing import NamedTuple

from crc32c import crc32c

from ferry.errors import MalformedRequestError, MessageTooLargeError
from ferry.names import validate_topic

from .config import MAX_PROPERTIES_BYTES
from .record import HEADER, HEADER_SIZE, MAX_HOST_BYTES, MAX_TAGS_BYTES, MSG_ID_BYTES
from .results import BatchPutResult, PutResult

MAX_QUEUE_ID = 0xFFFF
STAGING_BYTES = 1 << 20
# A staging buffer grown past this by one huge batch is given back after it.
KEEP_STAGING_BYTES = 8 << 20
# Record structs cached per part lengths (one pack_into writes a whole record);
# past this many, records of new shapes take the header + join path.
MAX_RECORD_FORMATS = 256
ID_KEY_CRC = crc32c(b"I")  # index key b"I" + msg_id hashes as crc32c(msg_id, ID_KEY_CRC)
_MAX_CACHED = 100_000
_pack_header = HEADER.pack_into

PackRecord = Callable[..., None]
# Per queue touched by a batch: [next queue offset, [first queue offset, CQ entries...],
# topic UTF-8, its length, CRC of the index key prefix b"K" + topic + b"\0"]
QueueRun = list


class Staged(NamedTuple):
    """A batch encoded in the staging buffer and validated, not yet written."""

    used: int  # staging bytes holding records
    # (staging position of the first record of a new segment, where the segment
    # before it gets its blank marker)
    seals: list[tuple[int, int]]
    start_rel: int  # position in the active segment of the first byte
    end_rel: int  # position in the last segment just past the batch
    queues: dict[tuple[str, int], QueueRun]
    items: list[tuple[int, int, int]]  # (index key hash, phy, store ts) in commit-log order
    results: list[PutResult] | BatchPutResult


class EncodeContext:
    """Caches and the staging buffer of one store's put path."""

    def __init__(self, max_message_bytes: int, store_host: str) -> None:
        self.max_body = max_message_bytes
        self.store_b = store_host.encode()
        self.topics: dict[str, tuple[bytes, int, int]] = {}
        # (topic, queue_id) checked before -> (topic UTF-8, its length, key prefix CRC)
        self.queue_info: dict[tuple[str, int], tuple[bytes, int, int]] = {}
        self.hosts: dict[str, tuple[bytes, int]] = {}
        self.tags: dict[str, tuple[bytes, int, int]] = {}
        self.tag_bytes: dict[bytes, int] = {}
        self.formats: dict[tuple[int, ...], PackRecord] = {}
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
        topic_b, topic_len, key_crc = self.topic(topic)
        if len(self.queue_info) >= _MAX_CACHED:
            self.queue_info.clear()
        self.queue_info[key] = (topic_b, topic_len, key_crc)
        return [next_qoff, [next_qoff], topic_b, topic_len, key_crc]

    def topic(self, topic: str) -> tuple[bytes, int, int]:
        """(UTF-8, its length, index key prefix CRC) of a valid topic name."""
        got = self.topics.get(topic)
        if got is None:
            topic_b = validate_topic(topic, allow_internal=True).encode()
            if len(self.topics) >= _MAX_CACHED:
                self.topics.clear()
            got = self.topics[topic] = (topic_b, len(topic_b), crc32c(b"K" + topic_b + b"\x00"))
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

    def tag(self, tags: str) -> tuple[bytes, int, int]:
        """(UTF-8, its length, tag hash) of a message's tags."""
        tags_b = tags.encode() if tags else b""
        if len(tags_b) > MAX_TAGS_BYTES:
            raise MessageTooLargeError(f"tags are longer than {MAX_TAGS_BYTES} bytes")
        got = (tags_b, len(tags_b), crc32c(tags_b) + 1 if tags_b else 0)
        if len(self.tags) < _MAX_CACHED:
            self.tags[tags] = got
        return got

    def tag_bytes_hash(self, tags_b: bytes) -> int:
        """The tag hash of UTF-8 tags taken from a batch input (checked to be UTF-8)."""
        tags_b.decode()  # stored tags are decoded as text: refuse what is not UTF-8
        th = crc32c(tags_b) + 1
        if len(self.tag_bytes) < _MAX_CACHED:
            self.tag_bytes[tags_b] = th
        return th

    def record_format(self, lens: tuple[int, ...]) -> PackRecord:
        """pack_into of a whole record with these part lengths (header + join once full).

        `lens` is (topic, born host, tags, keys, properties, body) lengths.
        """
        if len(self.formats) >= MAX_RECORD_FORMATS:
            return _pack_joined
        topic_len, born_len, tags_len, keys_len, props_len, body_len = lens
        parts = (topic_len, born_len, len(self.store_b), tags_len, keys_len, props_len, body_len)
        pack = struct.Struct(HEADER.format + "".join(f"{n}s" for n in parts)).pack_into
        self.formats[lens] = pack
        return pack

    def prefix_format(self, prefix_len: int) -> PackRecord:
        """pack_into of a record header followed by its topic, born host and store host."""
        pack = self._prefix_formats.get(prefix_len)
        if pack is None:
            if len(self._prefix_formats) >= MAX_RECORD_FORMATS:
                self._prefix_formats.clear()
            pack = struct.Struct(f"{HEADER.format}{prefix_len}s").pack_into
            self._prefix_formats[prefix_len] = pack
        return pack

    def too_large(self, body_len: int, props_len: int) -> MessageTooLargeError:
        """The error for a body or properties over their limits."""
        if body_len > self.max_body:
            return MessageTooLargeError(f"message body of {body_len} bytes exceeds {self.max_body}")
        return MessageTooLargeError(f"properties of {props_len} bytes exceed {MAX_PROPERTIES_BYTES}")


def checked_msg_id(msg_id: object) -> bytes:
    """A caller's msg_id that is not plain 16 bytes: converted, or refused."""
    if len(msg_id) != MSG_ID_BYTES:  # type: ignore[arg-type]
        raise MalformedRequestError(f"msg_id must be {MSG_ID_BYTES} bytes")
    return bytes(msg_id)  # type: ignore[call-overload]


def _pack_joined(buf: bytearray, pos: int, size: int, *fields: object) -> None:
    """A record without a cached struct: the header, then the parts joined."""
    _pack_header(buf, pos, size, *fields[:20])
    buf[pos + HEADER_SIZE:pos + size] = b"".join(fields[20:])  # type: ignore[arg-type]
