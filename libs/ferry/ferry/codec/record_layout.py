"""The commit-log record's byte layout: the header declared once, and its field constants.

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
