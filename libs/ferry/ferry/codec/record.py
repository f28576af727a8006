"""The commit-log record: the one byte layout that travels from disk to the consumer.

A record is written once by the store, served unchanged in PULL responses and
decoded by clients. The layout is declared here once, as data (`HEADER_LAYOUT`);
every reader takes a field by its name through the constants below (`H_*`: its
index in an unpacked header, `AT_*`: its byte offset), never by a bare number.
`docs/store-format.md` documents it byte by byte and a test holds the two together.

Record, little-endian, a 104-byte fixed header then the variable parts::

    off  size  field            type
      0     4  total_size       u32   whole record, header included
      4     4  magic            u32   RECORD_MAGIC (layout version 1)
      8     4  crc              u32   CRC32C of bytes [12, total_size)
     12     4  flags            u32
     16     4  queue_id         i32
     20     8  queue_offset     i64   entry number in the consume queue
     28     8  phy_offset       i64   byte position of this record in the commit log
     36     8  born_ts_ms       i64
     44     8  store_ts_ms      i64
     52     8  prepared_offset  i64
     60     4  reconsume_times  i32
     64     8  tag_hash         i64   tag_hash(tags), 0 = no tag
     72    16  msg_id           16s
     88     1  topic_len        u8
     89     1  born_host_len    u8
     90     1  store_host_len   u8
     91     1  reserved         u8    0
     92     2  tags_len         u16
     94     2  keys_len         u16
     96     4  props_len        u32
    100     4  body_len         u32
    104        topic | born_host | store_host | tags | keys | properties | body

The CRC starts after itself so that it covers every field a reader acts on,
positions included: a record copied to the wrong place fails its check.

End-of-segment blank marker (fills the rest of a segment a record did not fit in)::

      0     4  size             u32   bytes from the marker to the segment end
      4     4  magic            u32   BLANK_MAGIC
"""
from __future__ import annotations

import struct
from collections.abc import Iterator
from functools import cached_property
from typing import NamedTuple, TypeVar

from crc32c import crc32c

from ferry.codec.limits import (
    MAX_HOST_BYTES,
    MAX_KEYS_BYTES,
    MAX_TAGS_BYTES,
    MAX_TOPIC_BYTES,
    MSG_ID_BYTES,
)
from ferry.codec.msg_id import msg_id_hex, new_msg_id
from ferry.codec.properties import decode_properties
from ferry.codec.tags import tag_hash
from ferry.errors import CorruptRecordError

#: (field, struct code) in byte order: the one declaration of the header.
HEADER_LAYOUT = (
    ("total_size", "I"), ("magic", "I"), ("crc", "I"), ("flags", "I"), ("queue_id", "i"),
    ("queue_offset", "q"), ("phy_offset", "q"), ("born_ts_ms", "q"), ("store_ts_ms", "q"),
    ("prepared_offset", "q"), ("reconsume_times", "i"), ("tag_hash", "q"), ("msg_id", "16s"),
    ("topic_len", "B"), ("born_host_len", "B"), ("store_host_len", "B"), ("reserved", "B"),
    ("tags_len", "H"), ("keys_len", "H"), ("props_len", "I"), ("body_len", "I"),
)
HEADER = struct.Struct("<" + "".join(code for _, code in HEADER_LAYOUT))
HEADER_FIELDS = tuple(name for name, _ in HEADER_LAYOUT)
HEADER_SIZE = HEADER.size  # 104
#: The variable parts after the header, in order, and the header field giving each length.
VARIABLE_PARTS = ("topic", "born_host", "store_host", "tags", "keys", "properties", "body")
PART_LENGTH_FIELDS = ("topic_len", "born_host_len", "store_host_len", "tags_len", "keys_len",
                      "props_len", "body_len")


def _index(name: str) -> int:
    return HEADER_FIELDS.index(name)


def _offset(name: str) -> int:
    return struct.calcsize("<" + "".join(code for _, code in HEADER_LAYOUT[:_index(name)]))


# Index of each field in a tuple unpacked with HEADER (hot loops bind these to locals).
H_TOTAL_SIZE = _index("total_size")
H_MAGIC = _index("magic")
H_CRC = _index("crc")
H_FLAGS = _index("flags")
H_QUEUE_ID = _index("queue_id")
H_QUEUE_OFFSET = _index("queue_offset")
H_PHY_OFFSET = _index("phy_offset")
H_BORN_TS_MS = _index("born_ts_ms")
H_STORE_TS_MS = _index("store_ts_ms")
H_PREPARED_OFFSET = _index("prepared_offset")
H_RECONSUME_TIMES = _index("reconsume_times")
H_TAG_HASH = _index("tag_hash")
H_MSG_ID = _index("msg_id")
H_TOPIC_LEN = _index("topic_len")
H_BORN_HOST_LEN = _index("born_host_len")
H_STORE_HOST_LEN = _index("store_host_len")
H_TAGS_LEN = _index("tags_len")
H_KEYS_LEN = _index("keys_len")
H_PROPS_LEN = _index("props_len")
H_BODY_LEN = _index("body_len")
# Byte offset of the fields read or written on their own.
AT_CRC = _offset("crc")
AT_FLAGS = _offset("flags")
AT_PHY_OFFSET = _offset("phy_offset")
AT_QUEUE_OFFSET = _offset("queue_offset")
AT_STORE_TS_MS = _offset("store_ts_ms")
AT_MSG_ID = _offset("msg_id")
#: The CRC covers [CRC_START, total_size): everything after the CRC itself.
CRC_START = AT_CRC + 4

RECORD_MAGIC = 0x01595246  # b"FRY\x01": layout version 1
BLANK = struct.Struct("<II")
BLANK_FIELDS = ("size", "magic")
BLANK_MAGIC = 0xFF595246  # b"FRY\xff"
BLANK_SIZE = BLANK.size  # 8: a record is placed only if this much stays free after it


def _prefix(last: int) -> struct.Struct:
    """The header's first fields, up to index `last`."""
    return struct.Struct("<" + "".join(code for _, code in HEADER_LAYOUT[:last + 1]))


#: total_size and magic of a record, or size and magic of a blank marker: what a
#: reader looks at first to tell them apart and bound the rest.
SIZE_MAGIC = _prefix(H_MAGIC)
#: total_size, magic and crc: what a reader checks before it serves a record.
SIZE_MAGIC_CRC = _prefix(H_CRC)
U32 = struct.Struct("<I")
I64 = struct.Struct("<q")

_unpack_header = HEADER.unpack_from
_new_tuple = tuple.__new__
_T = TypeVar("_T")


class MessageIn(NamedTuple):
    """A message to append: the record fields a writer supplies (the store adds positions).

    A NamedTuple rather than a dataclass because a put path builds hundreds
    of thousands per second and tuple construction is several times cheaper.
    """

    topic: str
    queue_id: int
    body: bytes
    tags: str = ""
    keys: str = ""  # space-separated
    properties: bytes = b""  # encode_properties(...)
    msg_id: bytes = b""  # 16 bytes; generated by the store when empty
    flags: int = 0
    born_ts_ms: int = 0
    born_host: str = ""
    reconsume_times: int = 0
    prepared_offset: int = 0


class _StoredFields(NamedTuple):
    topic: str
    queue_id: int
    queue_offset: int
    phy_offset: int
    size: int
    flags: int
    born_ts_ms: int
    store_ts_ms: int
    born_host: str
    store_host: str
    reconsume_times: int
    prepared_offset: int
    tag_hash: int
    msg_id: bytes
    tags: str
    keys: str
    body: bytes
    properties_raw: bytes


class StoredMessage(_StoredFields):
    """A decoded record; `properties` is decoded from `properties_raw` on first use.

    Immutable like a frozen dataclass, but a NamedTuple: readers decode
    hundreds of thousands per second and a tuple costs a tenth of a dataclass
    to build. (No __slots__, so the instance dict can cache `properties`.)
    """

    @cached_property
    def properties(self) -> dict[str, str]:
        return decode_properties(self.properties_raw)

    @property
    def msg_id_hex(self) -> str:
        return msg_id_hex(self.msg_id)

    @property
    def end_offset(self) -> int:
        return self.phy_offset + self.size


def encode_record(msg: MessageIn, *, queue_offset: int, phy_offset: int, store_ts_ms: int,
                  store_host: str = "") -> bytes:
    """Encode one message as a standalone record (tools and tests; the store stages batches).

    A part over its limit or a msg_id that is not 16 bytes raises ValueError.
    """
    topic_b, born_b, store_b = msg.topic.encode(), msg.born_host.encode(), store_host.encode()
    tags_b, keys_b = msg.tags.encode(), msg.keys.encode()
    _check_lengths(topic_b, born_b, store_b, tags_b, keys_b)
    msg_id = msg.msg_id or new_msg_id()
    if len(msg_id) != MSG_ID_BYTES:
        raise ValueError(f"msg_id must be {MSG_ID_BYTES} bytes, got {len(msg_id)}")
    tail = b"".join((topic_b, born_b, store_b, tags_b, keys_b, msg.properties, msg.body))
    size = HEADER_SIZE + len(tail)
    buf = bytearray(size)
    # Arguments in HEADER_LAYOUT order.
    HEADER.pack_into(buf, 0, size, RECORD_MAGIC, 0, msg.flags, msg.queue_id, queue_offset,
                     phy_offset, msg.born_ts_ms, store_ts_ms, msg.prepared_offset,
                     msg.reconsume_times, tag_hash(msg.tags), msg_id, len(topic_b), len(born_b),
                     len(store_b), 0, len(tags_b), len(keys_b), len(msg.properties),
                     len(msg.body))
    buf[HEADER_SIZE:] = tail
    U32.pack_into(buf, AT_CRC, crc32c(memoryview(buf)[CRC_START:]))
    return bytes(buf)


def _check_lengths(topic_b: bytes, born_b: bytes, store_b: bytes, tags_b: bytes,
                   keys_b: bytes) -> None:
    """Raise ValueError when a variable part does not fit its length field."""
    if len(topic_b) > MAX_TOPIC_BYTES:
        raise ValueError(f"topic is longer than {MAX_TOPIC_BYTES} bytes")
    if len(born_b) > MAX_HOST_BYTES or len(store_b) > MAX_HOST_BYTES:
        raise ValueError(f"host is longer than {MAX_HOST_BYTES} bytes")
    if len(tags_b) > MAX_TAGS_BYTES:
        raise ValueError(f"tags are longer than {MAX_TAGS_BYTES} bytes")
    if len(keys_b) > MAX_KEYS_BYTES:
        raise ValueError(f"keys are longer than {MAX_KEYS_BYTES} bytes")


def check_records(view: memoryview, off: int, end: int, layout: struct.Struct = HEADER
                  ) -> list[tuple]:
    """The record check: verify the records that fill `view[off:end]` back to back and
    return their headers, unpacked with `layout`; raise CorruptRecordError naming the
    first check that failed and where. Every reader of records calls this one function:
    the store's reads, recovery, replication, the client's PULL decoder.

    Each record must carry RECORD_MAGIC, be at least HEADER_SIZE, end by `end`, and
    match its CRC. `layout` is HEADER, or a struct that starts with it (replication
    unpacks the topic too): then the part lengths must also add up to `total_size`,
    as a decoder needs. A reader that only serves the bytes passes SIZE_MAGIC_CRC:
    the CRC covers the lengths, and unpacking the whole header made the store's
    reads 14 % slower. A span per call, not a record: the PULL decoder checks its
    whole body in one call (a call per record cost it 15 %: micro bench, 1 KiB
    records, 2-core machine).
    """
    unpack = layout.unpack_from
    lengths = layout.size >= HEADER_SIZE
    heads: list[tuple] = []
    add = heads.append
    try:
        while off < end:
            h = unpack(view, off)
            size = h[H_TOTAL_SIZE]
            nxt = off + size
            # One condition (the common case passes it at the least cost); _fault names it.
            if (h[H_MAGIC] != RECORD_MAGIC or nxt > end or size < HEADER_SIZE
                    or (lengths and size != (
                        HEADER_SIZE + h[H_TOPIC_LEN] + h[H_BORN_HOST_LEN] + h[H_STORE_HOST_LEN]
                        + h[H_TAGS_LEN] + h[H_KEYS_LEN] + h[H_PROPS_LEN] + h[H_BODY_LEN]))
                    or crc32c(view[off + CRC_START:nxt]) != h[H_CRC]):
                raise CorruptRecordError(_fault(h, off, end, lengths))
            add(h)
            off = nxt
    except struct.error:
        raise CorruptRecordError(f"truncated record header at {off}") from None
    return heads


_PART_LENGTHS = tuple(HEADER_FIELDS.index(name) for name in PART_LENGTH_FIELDS)


def _fault(h: tuple, off: int, end: int, lengths: bool) -> str:
    """Which check of check_records the record at `off` (header `h`) failed, in their order."""
    size = h[H_TOTAL_SIZE]
    if h[H_MAGIC] != RECORD_MAGIC:
        return f"bad record magic {h[H_MAGIC]:#x} at {off}"
    if off + size > end or size < HEADER_SIZE:
        return f"record size {size} at {off} is out of bounds"
    if lengths and size != HEADER_SIZE + sum(h[i] for i in _PART_LENGTHS):
        return f"record part lengths at {off} do not add up to {size}"
    return f"record crc mismatch at {off}"


def check_record(buf: bytes | bytearray | memoryview, off: int = 0, limit: int = -1) -> int:
    """Verify the one record at `off` (check_records); return its size.

    `limit` is the end of readable data (default: the buffer end).
    """
    end_of_data = len(buf) if limit < 0 else limit
    if off < 0 or end_of_data - off < HEADER_SIZE:
        raise CorruptRecordError(f"truncated record header at {off}")
    size: int = SIZE_MAGIC.unpack_from(buf, off)[0]
    # (a size below a header's still checks one record: it fails as out of bounds)
    end = min(off + max(size, HEADER_SIZE), end_of_data)
    return check_records(memoryview(buf), off, end)[0][H_TOTAL_SIZE]


def decode_record(buf: bytes | bytearray | memoryview, off: int = 0) -> StoredMessage:
    """Decode and verify the record at `off`; raises CorruptRecordError when it fails a check."""
    if off < 0 or len(buf) - off < HEADER_SIZE:
        raise CorruptRecordError(f"truncated record header at {off}")
    mv = buf if type(buf) is memoryview else memoryview(buf)
    size = SIZE_MAGIC.unpack_from(mv, off)[0]
    h = check_records(mv, off, min(off + max(size, HEADER_SIZE), len(mv)))[0]
    raw = mv[off:off + size]
    # Ends of topic, born host, store host, tags, keys, properties, relative to the parts.
    p = h[H_TOPIC_LEN]
    p2 = p + h[H_BORN_HOST_LEN]
    p3 = p2 + h[H_STORE_HOST_LEN]
    p4 = p3 + h[H_TAGS_LEN]
    p5 = p4 + h[H_KEYS_LEN]
    p6 = HEADER_SIZE + p5 + h[H_PROPS_LEN]  # (in the record: where the body starts)
    texts = raw[HEADER_SIZE:HEADER_SIZE + p5].tobytes()  # topic | born | store | tags | keys
    try:
        # A store serves few (topic, born host, store host) triples and tags: decode
        # each once (the cached entry also pins the split, which the bytes alone do not).
        hosts = _TEXTS.get(texts[:p3])
        if hosts is None or hosts[3] != p or hosts[4] != p2:
            hosts = _cache_text(_TEXTS, texts[:p3], (texts[:p].decode(), texts[p:p2].decode(),
                                                    texts[p2:p3].decode(), p, p2))
        tags = _TAGS.get(texts[p3:p4]) if p4 > p3 else ""
        if tags is None:
            tags = _cache_text(_TAGS, texts[p3:p4], texts[p3:p4].decode())
        keys = texts[p4:].decode() if p5 > p4 else ""
    except UnicodeDecodeError as exc:
        raise CorruptRecordError(f"record text at {off} is not UTF-8: {exc}") from None
    return _new_tuple(StoredMessage, (
        hosts[0], h[H_QUEUE_ID], h[H_QUEUE_OFFSET], h[H_PHY_OFFSET], size, h[H_FLAGS],
        h[H_BORN_TS_MS], h[H_STORE_TS_MS], hosts[1], hosts[2], h[H_RECONSUME_TIMES],
        h[H_PREPARED_OFFSET], h[H_TAG_HASH], h[H_MSG_ID], tags, keys,
        raw[p6:].tobytes(), raw[HEADER_SIZE + p5:p6].tobytes()))


_TEXTS: dict[bytes, tuple[str, str, str, int, int]] = {}
_TAGS: dict[bytes, str] = {}
_MAX_TEXTS = 4096


def _cache_text(cache: dict, raw: bytes, value: _T) -> _T:
    if len(cache) >= _MAX_TEXTS:
        cache.clear()
    cache[raw] = value
    return value


def iter_records(buf: bytes | bytearray | memoryview) -> Iterator[StoredMessage]:
    """Decode back-to-back records (a PULL body); a truncated or bad one raises CorruptRecordError."""
    off = 0
    n = len(buf)
    while off < n:
        msg = decode_record(buf, off)
        off += msg.size
        yield msg
