"""The message batch input: many messages of one queue, as the producer encoded them.

(And the put path's loop over it, `stage_batch_input`.)

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

from crc32c import crc32c

from ferry.errors import MalformedRequestError

from .commit_log import CommitLog
from .config import MAX_PROPERTIES_BYTES
from .consume_queue import CQ_ENTRY
from .encode_context import ID_KEY_CRC, EncodeContext, QueueRun, Staged
from .record import BLANK_SIZE, CRC_START, HEADER_SIZE, RECORD_MAGIC, new_msg_id
from .results import BatchPutResult, PutStatus

BATCH_ENTRY = struct.Struct("<I16sqIHHII")
BATCH_ENTRY_FIELDS = (
    "length", "msg_id", "born_ts_ms", "flags", "tags_len", "keys_len", "props_len", "body_len",
)
BATCH_ENTRY_SIZE = BATCH_ENTRY.size  # 44
NO_MSG_ID = bytes(16)  # an all-zero msg_id: the store assigns one
_ENTRY_SIZE = BATCH_ENTRY_SIZE
_unpack_cq = CQ_ENTRY.unpack
_unpack_entry = BATCH_ENTRY.unpack_from
_pack_crc = struct.Struct("<I").pack_into
_pack_entry = CQ_ENTRY.pack
_new_tuple = tuple.__new__
_OK = PutStatus.OK
_NO_LIMIT = 1 << 62


def stage_batch_input(ctx: EncodeContext, cl: CommitLog, key: tuple[str, int], q: QueueRun,
                      born: tuple[bytes, int], data: bytes, ts: int,
                      max_messages: int | None) -> Staged:
    """Validate and encode every entry of `data` as records of queue `key` (see appender.py).

    `q` is the queue's run as `EncodeContext.queue` starts it, `born` the UTF-8 born
    host and its length. Raises MalformedRequestError, MessageTooLargeError or
    UnicodeDecodeError (tags or keys) before anything is written.
    """
    qid, store_b, max_body, tag_hashes = key[1], ctx.store_b, ctx.max_body, ctx.tag_bytes
    max_count = _NO_LIMIT if max_messages is None else max_messages
    first_qoff, run, topic_b, topic_len, key_crc = q
    born_b, born_len = born
    store_len = len(store_b)
    prefix = topic_b + born_b + store_b
    fixed = HEADER_SIZE + len(prefix) - _ENTRY_SIZE  # record size = entry length + fixed
    pack = ctx.prefix_format(len(prefix))
    seg = cl.active()
    seg_start, seg_bytes = seg.start_offset, seg.size
    rel = start_rel = cl.write_offset - seg_start
    limit = seg_bytes - BLANK_SIZE
    buf, mv = ctx.buf, ctx.mv
    cap, pos = len(buf), 0
    seals: list[tuple[int, int]] = []
    items: list[tuple[int, int, int]] = []
    add_entry, add_item = run.append, items.append
    qoff, src, at, stop = first_qoff, memoryview(data), 0, len(data)
    while at < stop:
        if stop - at < _ENTRY_SIZE:
            raise MalformedRequestError(f"message batch truncated: {stop - at} bytes left at "
                                        f"{at}, an entry head is {_ENTRY_SIZE}")
        length, msg_id, born_ts, flags, tags_len, keys_len, props_len, body_len = \
            _unpack_entry(data, at)
        if body_len > max_body or props_len > MAX_PROPERTIES_BYTES:
            raise ctx.too_large(body_len, props_len)
        if length != _ENTRY_SIZE + tags_len + keys_len + props_len + body_len \
                or length > stop - at:
            raise _bad_entry(at, length, stop)
        if qoff - first_qoff >= max_count:
            raise MalformedRequestError(f"the batch has more than {max_count} messages")
        p = at + _ENTRY_SIZE
        if tags_len:
            tags_b = data[p:p + tags_len]
            th = tag_hashes.get(tags_b) or ctx.tag_bytes_hash(tags_b)
        else:
            th = 0
        if msg_id == NO_MSG_ID:
            msg_id = new_msg_id()
        size = fixed + length
        end = pos + size
        if end > cap:
            buf, mv = ctx.grow(end, pos)
            cap = len(buf)
        if rel + size > limit:  # the record goes to the start of the next segment
            seals.append((pos, rel))
            seg_start += seg_bytes
            rel = 0
        phy = seg_start + rel
        pack(buf, pos, size, RECORD_MAGIC, 0, flags, qid, qoff, phy, born_ts, ts, 0, 0, th,
             msg_id, topic_len, born_len, store_len, 0, tags_len, keys_len, props_len, body_len,
             prefix)
        buf[end - length + _ENTRY_SIZE:end] = src[p:at + length]  # tags|keys|props|body as given
        _pack_crc(buf, pos + 8, crc32c(mv[pos + CRC_START:end]))
        pos = end
        rel += size
        add_entry(_pack_entry(phy, size, th))
        add_item((crc32c(msg_id, ID_KEY_CRC), phy, ts))
        if keys_len:
            keys_b = data[p + tags_len:p + tags_len + keys_len]
            if not keys_b.isascii():
                keys_b.decode()  # stored keys are decoded as text: refuse what is not UTF-8
            for k in keys_b.split(b" ") if 32 in keys_b else (keys_b,):
                if k:
                    add_item((crc32c(k, key_crc), phy, ts))
        qoff += 1
        at += length
    if qoff == first_qoff:
        raise MalformedRequestError("the message batch is empty")
    q[0] = qoff
    result = _new_tuple(BatchPutResult, (_OK, qoff - first_qoff, first_qoff,
                                         _unpack_cq(run[1])[0], seg_start + rel, ts))
    return _new_tuple(Staged, (pos, seals, start_rel, rel, {key: q}, items, result))


def _bad_entry(at: int, length: int, stop: int) -> MalformedRequestError:
    if length > stop - at:
        return MalformedRequestError(f"message batch truncated: the entry at {at} needs {length} "
                                     f"bytes, {stop - at} are left")
    return MalformedRequestError(f"message at {at}: entry length {length} disagrees with its "
                                 "field lengths")
