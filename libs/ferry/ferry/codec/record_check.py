"""The record check and decoder: what every reader of records runs on every record.

The store's reads, recovery and replication, and the client's PULL decoder, call
`check_records`; `decode_record` builds a `StoredMessage`. The read path's hot
module, so it has a compiled twin (`ferry.codec._record_check_c`, built by
`make setup`; `ferry.extensions`, docs/performance.md "Compiled twins"), and holds
only this: the layout is `ferry.codec.record_layout`, and `ferry.codec.record`
re-exports both, so callers import from there as always.
"""
from __future__ import annotations

import struct
from typing import Any, TypeVar

from crc32c import crc32c

from ferry import extensions
from ferry.codec.record_layout import (
    CRC_START,
    H_BODY_LEN,
    H_BORN_HOST_LEN,
    H_CRC,
    H_KEYS_LEN,
    H_MAGIC,
    H_PROPS_LEN,
    H_STORE_HOST_LEN,
    H_TAGS_LEN,
    H_TOPIC_LEN,
    H_TOTAL_SIZE,
    HEADER,
    HEADER_FIELDS,
    HEADER_SIZE,
    PART_LENGTH_FIELDS,
    RECORD_MAGIC,
    SIZE_MAGIC,
)
from ferry.codec.stored_message import StoredMessage
from ferry.errors import CorruptRecordError

_new_tuple = tuple.__new__
_unpack_size = SIZE_MAGIC.unpack_from
_unpack_header = HEADER.unpack_from
_PART_LENGTHS = tuple(HEADER_FIELDS.index(name) for name in PART_LENGTH_FIELDS)
_T = TypeVar("_T")


def check_records(view: memoryview, off: int, end: int, layout: struct.Struct = HEADER
                  ) -> list[tuple[Any, ...]]:
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
    # Every global is a local of a known type and the header's fields are declared `int`:
    # the compiled twin (mypyc) then compares and adds C integers, with no module-dict
    # lookups (docs/performance.md, Writing a hot module for mypyc).
    unpack = layout.unpack_from
    lengths: bool = layout.size >= HEADER_SIZE
    header_size: int = HEADER_SIZE
    magic: int = RECORD_MAGIC
    crc_start: int = CRC_START
    i_size: int = H_TOTAL_SIZE
    i_magic: int = H_MAGIC
    i_crc: int = H_CRC
    i_topic, i_born, i_store, i_tags = H_TOPIC_LEN, H_BORN_HOST_LEN, H_STORE_HOST_LEN, H_TAGS_LEN
    i_keys, i_props, i_body = H_KEYS_LEN, H_PROPS_LEN, H_BODY_LEN
    crc = crc32c
    heads: list[tuple[Any, ...]] = []
    size: int
    nxt: int
    try:
        while off < end:
            h = unpack(view, off)
            size = h[i_size]
            nxt = off + size
            # One condition (the common case passes it at the least cost); _fault names it.
            if (h[i_magic] != magic or nxt > end or size < header_size
                    or (lengths and size != (
                        header_size + h[i_topic] + h[i_born] + h[i_store] + h[i_tags]
                        + h[i_keys] + h[i_props] + h[i_body]))
                    or crc(view[off + crc_start:nxt]) != h[i_crc]):
                raise CorruptRecordError(_fault(h, off, end, lengths))
            heads.append(h)
            off = nxt
    except struct.error:
        raise CorruptRecordError(f"truncated record header at {off}") from None
    return heads


def _fault(h: tuple[Any, ...], off: int, end: int, lengths: bool) -> str:
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
    size: int = _unpack_size(buf, off)[0]
    # (a size below a header's still checks one record: it fails as out of bounds)
    end = min(off + max(size, HEADER_SIZE), end_of_data)
    got: int = check_records(memoryview(buf), off, end)[0][H_TOTAL_SIZE]
    return got


def decode_record(buf: bytes | bytearray | memoryview, off: int = 0) -> StoredMessage:
    """Decode and verify the record at `off`; raises CorruptRecordError when it fails a check.

    The checks of check_records with HEADER, in their order, on the one record (the same
    refusals, word for word: tests/codec/test_record_check_twin.py), done inline on the
    header's fields unpacked once into typed locals: a call of check_records and the
    fields taken by index cost the decoder about a third of its time.
    """
    header_size: int = HEADER_SIZE
    if off < 0 or len(buf) - off < header_size:
        raise CorruptRecordError(f"truncated record header at {off}")
    mv = buf if type(buf) is memoryview else memoryview(buf)
    h = _unpack_header(mv, off)
    size: int
    magic: int
    crc: int
    p: int  # then the ends of born host, store host, tags, keys, properties (below)
    born_len: int
    store_len: int
    tags_len: int
    keys_len: int
    props_len: int
    body_len: int
    # The header's fields in HEADER_FIELDS order.
    (size, magic, crc, flags, queue_id, queue_offset, phy_offset, born_ts_ms, store_ts_ms,
     prepared_offset, reconsume_times, tag_hash, msg_id, p, born_len, store_len, _reserved,
     tags_len, keys_len, props_len, body_len) = h
    nxt = off + size
    if (magic != RECORD_MAGIC or nxt > len(mv) or size < header_size
            or size != (header_size + p + born_len + store_len + tags_len + keys_len
                        + props_len + body_len)
            or crc32c(mv[off + CRC_START:nxt]) != crc):
        raise CorruptRecordError(_fault(h, off, len(mv), True))
    # Ends of topic, born host, store host, tags, keys, properties, relative to the parts.
    p2 = p + born_len
    p3 = p2 + store_len
    p4 = p3 + tags_len
    p5 = p4 + keys_len
    at = off + header_size  # where the parts start in `mv`
    p6 = at + p5 + props_len  # where the body starts in `mv`
    texts = mv[at:at + p5].tobytes()  # topic | born | store | tags | keys
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
    msg: StoredMessage = _new_tuple(StoredMessage, (
        hosts[0], queue_id, queue_offset, phy_offset, size, flags, born_ts_ms, store_ts_ms,
        hosts[1], hosts[2], reconsume_times, prepared_offset, tag_hash, msg_id, tags, keys,
        mv[p6:nxt].tobytes(), mv[at + p5:p6].tobytes()))
    return msg


_TEXTS: dict[bytes, tuple[str, str, str, int, int]] = {}
_TAGS: dict[bytes, str] = {}
_MAX_TEXTS = 4096


def _cache_text(cache: dict[bytes, _T], raw: bytes, value: _T) -> _T:
    if len(cache) >= _MAX_TEXTS:
        cache.clear()
    cache[raw] = value
    return value


# -- compiled twin: the build compiles this file down to here --
extensions.install(globals(), ("check_records", "check_record", "decode_record"))
