"""The message batch input: many messages of one queue, as the producer encoded them.

`MessageStore.put_encoded_batch` takes a batch in this layout so that the broker
can hand a SEND body to the store without building an object per message. The
store owns this declaration (it may not import `ferry.wire`); it is the same
layout as the wire's SEND body, which `tests/store/test_batch_input.py` checks,
and `docs/store-format.md` documents it byte by byte.

One entry, little-endian, entries back to back with no padding::

    off  size  field        type
      0     4  length       u32   whole entry, this field included
      4    16  msg_id       16s   all zero: the store assigns one
     20     8  born_ts_ms   i64
     28     4  flags        u32
     32     2  tags_len     u16
     34     2  keys_len     u16
     36     4  props_len    u32
     40     4  body_len     u32
     44        tags | keys | properties | body

`length` repeats the sum of the lengths on purpose: the two must agree, which
catches misframed input before anything is trusted.
"""
from __future__ import annotations

import struct

BATCH_ENTRY = struct.Struct("<I16sqIHHII")
BATCH_ENTRY_FIELDS = (
    "length", "msg_id", "born_ts_ms", "flags", "tags_len", "keys_len", "props_len", "body_len",
)
BATCH_ENTRY_SIZE = BATCH_ENTRY.size  # 44
NO_MSG_ID = bytes(16)  # an all-zero msg_id: the store assigns one
