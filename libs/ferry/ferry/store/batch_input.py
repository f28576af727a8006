"""The put path's staging loop over the batch input: SEND entries back to back.

`MessageStore.put_encoded_batch` takes a batch in the SEND-entry layout
(`ferry.codec.entry`, the wire's SEND body) so that the broker can hand a SEND
body to the store without building an object per message; `put_batch` encodes
its `MessageIn` tuples into the same layout and stages them here too, so there
is one record encoder. `docs/store-format.md` documents the layout byte by byte.
"""
from __future__ import annotations

from typing import Any

from crc32c import crc32c

from ferry import extensions
from ferry.codec.entry import ENTRY_HEAD, ENTRY_HEAD_SIZE
from ferry.codec.limits import MAX_PROPERTIES_BYTES
from ferry.codec.msg_id import NO_MSG_ID, new_msg_id
from ferry.codec.record import AT_CRC, BLANK_SIZE, CRC_START, HEADER_SIZE, RECORD_MAGIC, U32
from ferry.errors import MalformedRequestError

from .consume_queue import CQ_ENTRY
from .encode_context import EncodeContext, QueueRun, StageState
from .index_keys import (
    EXACT_ID_FLAGS,
    ID_KEY_CRC,
    ID_RUN_KEY_CRC,
    ID_RUN_LOW_BITS,
    ID_RUN_PREFIX_BYTES,
    ID_WINDOW_BYTE,
    MAX_ID_RUN,
)

_ENTRY_SIZE = ENTRY_HEAD_SIZE
_unpack_entry = ENTRY_HEAD.unpack_from
_pack_crc = U32.pack_into
_pack_cq = CQ_ENTRY.pack
NO_LIMIT = 1 << 62


def stage_batch_input(ctx: EncodeContext, st: StageState, q: QueueRun, born: tuple[bytes, int],
                      data: bytes | bytearray | memoryview, ts: int, max_count: int = NO_LIMIT,
                      reconsume_times: int = 0,
                      prepared_offset: int = 0, refuse_flags: int = 0,
                      exact_ids: bool = False) -> int:
    """Validate and encode every entry of `data` as records of the queue `q`; the count.

    Continues `st` (staging position, log position, index items) and `q` (queue
    offsets, consume-queue entries). `born` is the UTF-8 born host and its length;
    `reconsume_times` and `prepared_offset` go to every record's header. `exact_ids`:
    every record gets its exact id key (else only those with EXACT_ID_FLAGS). `data` may
    be a view of a receive buffer: this loop copies it first, the native twin reads it
    in place (the broker hands SEND bodies over as views). Raises
    MalformedRequestError (an entry with a flag in `refuse_flags` among others),
    MessageTooLargeError, UnicodeDecodeError (tags or keys) or struct.error
    (`reconsume_times`, `prepared_offset` out of range) before anything is written.

    The hottest code of the broker: every message passes here once, with all it
    needs bound to locals (about 2 µs a message with the write and dispatch, 64-message
    batches of 100-byte bodies, on the 2-core development machine).
    """
    raw: bytes = data if type(data) is bytes else bytes(data)
    # Everything the loop uses is a local of a known type: the compiled twin (mypyc) then
    # does the integer arithmetic in C and no module-dict lookups; CPython gains a little.
    store_b, max_body, tag_hashes, seg_bytes = ctx.store_b, ctx.max_body, ctx.tag_bytes, ctx.seg_bytes
    qid, topic_b, key_crc = q.queue_id, q.topic_b, q.key_crc
    topic_len = len(topic_b)
    born_b, born_len = born
    store_len = len(store_b)
    prefix = topic_b + born_b + store_b
    entry_size, max_props, magic = _ENTRY_SIZE, MAX_PROPERTIES_BYTES, RECORD_MAGIC
    fixed = HEADER_SIZE + len(prefix) - entry_size  # record size = entry length + fixed
    payload_at = HEADER_SIZE + len(prefix)  # where tags|keys|props|body start in a record
    pack = ctx.prefix_format(len(prefix))
    unpack_entry, pack_crc, pack_cq, crc = _unpack_entry, _pack_crc, _pack_cq, crc32c
    at_crc, crc_start, no_id, new_id = AT_CRC, CRC_START, NO_MSG_ID, new_msg_id
    seg_start, rel, pos = st.seg_start, st.rel, st.pos
    limit = seg_bytes - BLANK_SIZE
    buf, mv = ctx.buf, ctx.mv
    cap = len(buf)
    seals, entries, items = st.seals, q.entries, st.items
    first_qoff = qoff = q.next_offset
    qoff_limit = first_qoff + max_count
    src, at, stop = memoryview(raw), 0, len(raw)
    # The index-key rule (index_keys.py), inlined once here for speed: IdRuns.add, which
    # re-dispatch and replicas call, takes about 0.34 us a record, a tenth of this loop's
    # 3 us a message (micro bench, 256 x 1 KiB entries, 2-core machine). The id run being
    # staged: its id window (prefix and high bits of the last byte) and how many more
    # records it may take; a batch, a segment roll or another window starts a new one.
    run_prefix, run_high, run_left = b"", -1, 0
    run_crc, run_cut, low_bits = ID_RUN_KEY_CRC, ID_RUN_PREFIX_BYTES, ID_RUN_LOW_BITS
    exact_flags, id_crc, window_byte = EXACT_ID_FLAGS, ID_KEY_CRC, ID_WINDOW_BYTE
    # What the loop only passes on stays an object, so the twin does not box it again for
    # every call (its ints are C integers); the entry head's fields are declared, as
    # struct's unpack gives them untyped.
    ts_o: Any = ts
    prepared_o: Any = prepared_offset
    reconsume_o: Any = reconsume_times
    born_ts: Any
    msg_id: bytes
    length: int
    flags: int
    tags_len: int
    keys_len: int
    props_len: int
    body_len: int
    th: int
    while at < stop:
        if stop - at < entry_size:
            raise MalformedRequestError(f"message batch truncated: {stop - at} bytes left at "
                                        f"{at}, an entry head is {entry_size}")
        # The head's fields in ENTRY_HEAD_FIELDS order.
        length, msg_id, born_ts, flags, tags_len, keys_len, props_len, body_len = \
            unpack_entry(raw, at)
        if body_len > max_body or props_len > max_props:
            raise ctx.too_large(body_len, props_len)
        if length != entry_size + tags_len + keys_len + props_len + body_len \
                or length > stop - at:
            raise _bad_entry(at, length, stop)
        if flags & refuse_flags:
            raise MalformedRequestError(f"message at {at} carries flag(s) {flags & refuse_flags} "
                                        "that the SEND does not announce")
        if qoff >= qoff_limit:
            raise MalformedRequestError(f"the batch has more than {max_count} messages")
        p = at + entry_size
        if tags_len:
            tags_b = raw[p:p + tags_len]
            th = tag_hashes.get(tags_b) or ctx.tag_bytes_hash(tags_b)
        else:
            th = 0
        if msg_id == no_id:
            msg_id = new_id()
        size = fixed + length
        end = pos + size
        if end > cap:
            buf, mv = ctx.grow(end, pos)
            cap = len(buf)
        if rel + size > limit:  # the record goes to the start of the next segment
            seals.append((pos, rel))
            seg_start += seg_bytes
            rel = 0
            run_left = 0
        phy = seg_start + rel
        # The header in HEADER_LAYOUT order (crc 0 until computed), then topic|born|store.
        pack(buf, pos, size, magic, 0, flags, qid, qoff, phy, born_ts, ts_o,
             prepared_o, reconsume_o, th, msg_id, topic_len, born_len, store_len, 0,
             tags_len, keys_len, props_len, body_len, prefix)
        # tags|keys|props|body as given (a memoryview slice assignment: a plain memcpy)
        mv[pos + payload_at:end] = src[p:at + length]
        pack_crc(buf, pos + at_crc, crc(mv[pos + crc_start:end]))
        pos = end
        rel += size
        entries.append(pack_cq(phy, size, th))
        id_prefix = msg_id[:run_cut]
        id_high = msg_id[run_cut] >> low_bits
        if exact_ids or flags & exact_flags:  # its exact key; the run (if any) ends here
            items.append((crc(msg_id, id_crc), phy, ts_o))
            run_left = 0
        elif run_left and id_high == run_high and id_prefix == run_prefix:
            run_left -= 1
        else:  # the first record of an id run: its index key
            items.append((crc(id_prefix + window_byte[id_high], run_crc), phy, ts_o))
            run_prefix, run_high, run_left = id_prefix, id_high, MAX_ID_RUN - 1
        if keys_len:
            keys_b = raw[p + tags_len:p + tags_len + keys_len]
            if not keys_b.isascii():
                keys_b.decode()  # stored keys are decoded as text: refuse what is not UTF-8
            for k in keys_b.split(b" ") if 32 in keys_b else (keys_b,):
                if k:
                    items.append((crc(k, key_crc), phy, ts_o))
        qoff += 1
        at += length
    if qoff == first_qoff:
        raise MalformedRequestError("the message batch is empty")
    q.next_offset = qoff
    st.seg_start, st.rel, st.pos = seg_start, rel, pos
    return qoff - first_qoff


def _bad_entry(at: int, length: int, stop: int) -> MalformedRequestError:
    if length > stop - at:
        return MalformedRequestError(f"message batch truncated: the entry at {at} needs {length} "
                                     f"bytes, {stop - at} are left")
    return MalformedRequestError(f"message at {at}: entry length {length} disagrees with its "
                                 "field lengths")


# -- compiled twin: the build compiles this file down to here --
extensions.install(globals(), ("stage_batch_input",))
