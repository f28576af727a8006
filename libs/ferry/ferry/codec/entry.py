"""The SEND entry: one message of a batch as a producer encodes it.

The wire's SEND body (`docs/protocol.md`) and the store's batch input
(`MessageStore.put_encoded_batch`, `docs/store-format.md`) are entries in this
layout back to back, so that the broker hands a SEND body to the store without
building an object per message. Declared here once for both.

One entry, little-endian, no padding::

    off  size  field        type
      0     4  length       u32   whole entry, this field included
      4    16  msg_id       16s   all zero: none, the store assigns one
     20     8  born_ts_ms   i64   the producer's clock when it created the message
     28     4  flags        u32   MessageFlag bits, stored as given
     32     2  tags_len     u16
     34     2  keys_len     u16
     36     4  props_len    u32
     40     4  body_len     u32
     44        tags | keys | properties | body

`length` repeats the sum of the lengths on purpose: a reader checks that the
two agree, which catches misframed input before anything is trusted.
"""
from __future__ import annotations

import struct

from ferry.codec.msg_id import NO_MSG_ID

ENTRY_HEAD = struct.Struct("<I16sqIHHII")
#: The head's fields in order (a reader unpacks them in this order).
ENTRY_HEAD_FIELDS = (
    "length", "msg_id", "born_ts_ms", "flags", "tags_len", "keys_len", "props_len", "body_len",
)
ENTRY_HEAD_SIZE = ENTRY_HEAD.size  # 44
#: The variable parts after the head, in order.
ENTRY_PARTS = ("tags", "keys", "properties", "body")

_pack_head = ENTRY_HEAD.pack


def append_entry(parts: list[bytes], msg_id: bytes, born_ts_ms: int, flags: int, tags_b: bytes,
                 keys_b: bytes, props: bytes, body: bytes) -> None:
    """Append one entry's bytes to `parts`: its head, then its parts (b"".join them).

    The one encoder of the layout. Callers check the limits they report on;
    a field that does not fit its slot raises struct.error.
    """
    tags_len, keys_len, props_len, body_len = len(tags_b), len(keys_b), len(props), len(body)
    parts += (_pack_head(ENTRY_HEAD_SIZE + tags_len + keys_len + props_len + body_len,
                         msg_id or NO_MSG_ID, born_ts_ms, flags,
                         tags_len, keys_len, props_len, body_len),
              tags_b, keys_b, props, body)
