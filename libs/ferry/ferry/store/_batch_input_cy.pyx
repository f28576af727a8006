# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The native twin of `ferry.store.batch_input.stage_batch_input` (Cython, hand-written).

The mypyc twin runs the pure loop's own source and still pays, per message, for
what it calls as CPython does: a 24-field `struct` pack, a tuple from the entry
head's unpack, memoryview slices and a `crc32c` call per record and per index key.
This twin writes the header field by field into the staging buffer and computes
CRC32C in place with the CPU's instruction (SSE 4.2), making Python objects only
for what the store keeps: the consume-queue entry, the index items, and tags.

It mirrors the pure loop byte for byte: the same staged bytes, index items,
consume-queue entries, segment seals and errors, word for word
(`tests/store/test_batch_input_twin.py` holds the two together on generated input).
`MIRRORS_SHA256` is the SHA-256 of the `batch_input.py` it mirrors: after any edit of
that file `ferry.extensions` refuses this twin (the mypyc twin, built from the new
source, runs) until this file is checked against it and the hash updated. Input
outside the fast path's C types (a store timestamp or prepared offset past 64
bits, a `data` that is no flat byte buffer, ...) goes to the pure loop, which refuses it
as it always did. Without SSE 4.2 (or off x86-64) the import fails and the mypyc
twin runs.
"""
from libc.stdint cimport int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t
from libc.string cimport memcmp, memcpy
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_GET_SIZE
from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer

cdef extern from "native_crc32c.h":
    int ferry_crc_hw()
    uint32_t ferry_crc32c(uint32_t value, const unsigned char *p, size_t n)
    int ferry_little_endian()

from ferry.codec.entry import ENTRY_HEAD_SIZE
from ferry.codec.limits import MAX_PROPERTIES_BYTES
from ferry.codec.msg_id import new_msg_id
from ferry.codec.record import AT_CRC, BLANK_SIZE, CRC_START, HEADER_SIZE, RECORD_MAGIC
from ferry.errors import MalformedRequestError
from ferry.store.index_keys import (
    EXACT_ID_FLAGS,
    ID_KEY_CRC,
    ID_RUN_KEY_CRC,
    ID_RUN_LOW_BITS,
    ID_RUN_PREFIX_BYTES,
    MAX_ID_RUN,
)

if not ferry_crc_hw() or not ferry_little_endian():
    raise ImportError("the native staging loop needs x86-64 with SSE 4.2 (CRC32C)")
if (ENTRY_HEAD_SIZE, HEADER_SIZE, AT_CRC, CRC_START, ID_RUN_PREFIX_BYTES) != (44, 104, 8, 12, 15):
    raise ImportError("the record or entry layout is not the one this twin writes")

#: SHA-256 of the ferry/store/batch_input.py this file mirrors (see the docstring).
MIRRORS_SHA256 = "ff2e06fdd250a850d057ba6700a2e182ae94b7fbc2aa855355dbcd839fc44063"

cdef object I64_LOW = -(2 ** 63)
cdef object I64_HIGH = 2 ** 63
cdef object I32_LOW = -(2 ** 31)
cdef object I32_HIGH = 2 ** 31
cdef object NO_LIMIT_OBJ = 1 << 62


cdef inline uint32_t rd_u32(const unsigned char *p) noexcept nogil:
    cdef uint32_t v
    memcpy(&v, p, 4)
    return v


cdef inline uint16_t rd_u16(const unsigned char *p) noexcept nogil:
    cdef uint16_t v
    memcpy(&v, p, 2)
    return v


cdef inline int64_t rd_i64(const unsigned char *p) noexcept nogil:
    cdef int64_t v
    memcpy(&v, p, 8)
    return v


cdef inline void wr_u32(unsigned char *p, uint32_t v) noexcept nogil:
    memcpy(p, &v, 4)


cdef inline void wr_i32(unsigned char *p, int32_t v) noexcept nogil:
    memcpy(p, &v, 4)


cdef inline void wr_u16(unsigned char *p, uint16_t v) noexcept nogil:
    memcpy(p, &v, 2)


cdef inline void wr_i64(unsigned char *p, int64_t v) noexcept nogil:
    memcpy(p, &v, 8)


cdef bint _fast_inputs(object ctx, object q, object born, object data, object ts,
                       object max_count, object reconsume_times, object prepared_offset,
                       object refuse_flags):
    """Whether every value the loop turns into a C integer fits the field it goes to
    (else the pure loop runs, and raises what it raises)."""
    if type(ts) is not int or type(max_count) is not int:
        return False
    if type(data) is memoryview:   # a view of a receive buffer: read in place when flat
        if not (data.c_contiguous and data.itemsize == 1):
            return False
    elif type(data) is not bytes and type(data) is not bytearray:
        return False
    if type(reconsume_times) is not int or type(prepared_offset) is not int:
        return False
    if type(refuse_flags) is not int or not 0 <= refuse_flags < (1 << 32):
        return False
    if not (I64_LOW <= ts < I64_HIGH and I64_LOW <= prepared_offset < I64_HIGH
            and I32_LOW <= reconsume_times < I32_HIGH and 0 <= max_count <= NO_LIMIT_OBJ):
        return False
    born_b, born_len = born
    if type(born_b) is not bytes or born_len != len(born_b) or len(born_b) > 255:
        return False
    if type(q.topic_b) is not bytes or len(q.topic_b) > 255 or type(ctx.store_b) is not bytes:
        return False
    if len(ctx.store_b) > 255 or type(ctx.buf) is not bytearray:
        return False
    qid, key_crc = q.queue_id, q.key_crc
    if type(qid) is not int or type(key_crc) is not int:
        return False
    return I32_LOW <= qid < I32_HIGH and 0 <= key_crc < (1 << 32)


def stage_batch_input(ctx, st, q, born, data, ts, max_count=NO_LIMIT_OBJ,
                      reconsume_times=0, prepared_offset=0, refuse_flags=0,
                      exact_ids=False):
    """`ferry.store.batch_input.stage_batch_input`, natively (same arguments, results,
    state changes and errors)."""
    if not _fast_inputs(ctx, q, born, data, ts, max_count, reconsume_times,
                        prepared_offset, refuse_flags):
        from ferry import extensions
        pure = extensions.pure("ferry.store.batch_input", "stage_batch_input")
        return pure(ctx, st, q, born, data, ts, max_count, reconsume_times,
                    prepared_offset, refuse_flags, exact_ids)
    cdef bytes store_b = ctx.store_b
    cdef bytes topic_b = q.topic_b
    cdef bytes born_b = born[0]
    cdef dict tag_hashes = ctx.tag_bytes
    cdef int64_t max_body = ctx.max_body
    cdef int64_t seg_bytes = ctx.seg_bytes
    cdef int32_t qid = q.queue_id
    cdef uint32_t key_crc = q.key_crc
    cdef bytes prefix = topic_b + born_b + store_b
    cdef Py_ssize_t prefix_len = PyBytes_GET_SIZE(prefix)
    cdef uint8_t topic_len = <uint8_t>PyBytes_GET_SIZE(topic_b)
    cdef uint8_t born_len = <uint8_t>PyBytes_GET_SIZE(born_b)
    cdef uint8_t store_len = <uint8_t>PyBytes_GET_SIZE(store_b)
    cdef const unsigned char *pre = <const unsigned char *>PyBytes_AS_STRING(prefix)
    cdef int64_t entry_size = ENTRY_HEAD_SIZE
    cdef int64_t max_props = MAX_PROPERTIES_BYTES
    cdef uint32_t magic = RECORD_MAGIC
    cdef int64_t header_size = HEADER_SIZE
    cdef int64_t fixed = header_size + prefix_len - entry_size
    cdef int64_t payload_at = header_size + prefix_len
    cdef int64_t ts_c = ts
    cdef int64_t prepared_c = prepared_offset
    cdef int32_t reconsume_c = reconsume_times
    cdef uint32_t refuse_c = refuse_flags
    cdef int64_t seg_start = st.seg_start
    cdef int64_t rel = st.rel
    cdef int64_t pos = st.pos
    cdef int64_t limit = seg_bytes - BLANK_SIZE
    cdef object buf = ctx.buf
    cdef unsigned char *out = <unsigned char *>PyByteArray_AS_STRING(buf)
    cdef int64_t cap = PyByteArray_GET_SIZE(buf)
    cdef list seals = st.seals
    cdef list entries = q.entries
    cdef list items = st.items
    cdef int64_t first_qoff = q.next_offset
    cdef int64_t qoff = first_qoff
    cdef int64_t qoff_limit = first_qoff + <int64_t>max_count
    # `data` is read in place (a SEND body is a view of the connection's receive buffer):
    # the buffer is held until the loop ends, so it can be neither resized nor freed.
    cdef Py_buffer pb
    PyObject_GetBuffer(data, &pb, PyBUF_SIMPLE)
    cdef const unsigned char *src = <const unsigned char *>pb.buf
    cdef int64_t at = 0
    cdef int64_t stop = pb.len
    cdef bint exact_all = bool(exact_ids)
    cdef uint32_t exact_flags = EXACT_ID_FLAGS
    cdef uint32_t id_crc = ID_KEY_CRC
    cdef uint32_t run_crc = ID_RUN_KEY_CRC
    cdef int run_cut = ID_RUN_PREFIX_BYTES
    cdef int low_bits = ID_RUN_LOW_BITS
    cdef int max_run = MAX_ID_RUN
    # The id run being staged: its prefix, the high bits of its last byte, records left.
    cdef unsigned char run_prefix[16]
    cdef int run_high = -1
    cdef int run_left = 0
    cdef unsigned char msg_id[16]
    cdef unsigned char cq[20]
    cdef unsigned char window_byte
    cdef const unsigned char *e
    cdef unsigned char *r
    cdef uint32_t length, flags, props_len, body_len, crc
    cdef uint16_t tags_len, keys_len
    cdef int64_t born_ts, p, size, end, phy, th, k_at, k_end, i
    cdef object ts_o = ts
    cdef object tags_b, got, new_id, keys_b
    try:
        while at < stop:
            if stop - at < entry_size:
                raise MalformedRequestError(f"message batch truncated: {stop - at} bytes left at "
                                            f"{at}, an entry head is {entry_size}")
            # The entry head, ENTRY_LAYOUT: length, msg_id, born_ts_ms, flags, tags_len,
            # keys_len, props_len, body_len.
            e = src + at
            length = rd_u32(e)
            memcpy(msg_id, e + 4, 16)
            born_ts = rd_i64(e + 20)
            flags = rd_u32(e + 28)
            tags_len = rd_u16(e + 32)
            keys_len = rd_u16(e + 34)
            props_len = rd_u32(e + 36)
            body_len = rd_u32(e + 40)
            if body_len > max_body or props_len > max_props:
                raise ctx.too_large(body_len, props_len)
            if (<int64_t>length != entry_size + tags_len + keys_len + <int64_t>props_len
                    + <int64_t>body_len or <int64_t>length > stop - at):
                from ferry.store import batch_input
                raise batch_input._bad_entry(at, length, stop)
            if flags & refuse_c:
                raise MalformedRequestError(f"message at {at} carries flag(s) {flags & refuse_c} "
                                            "that the SEND does not announce")
            if qoff >= qoff_limit:
                raise MalformedRequestError(f"the batch has more than {max_count} messages")
            p = at + entry_size
            if tags_len:
                tags_b = PyBytes_FromStringAndSize(<const char *>src + p, tags_len)
                got = tag_hashes.get(tags_b)
                if not got:
                    got = ctx.tag_bytes_hash(tags_b)
                th = got
            else:
                th = 0
            for i in range(16):
                if msg_id[i]:
                    break
            else:
                new_id = new_msg_id()
                memcpy(msg_id, PyBytes_AS_STRING(new_id), 16)
            size = fixed + length
            end = pos + size
            if end > cap:
                buf = ctx.grow(end, pos)[0]
                out = <unsigned char *>PyByteArray_AS_STRING(buf)
                cap = PyByteArray_GET_SIZE(buf)
            if rel + size > limit:  # the record goes to the start of the next segment
                seals.append((pos, rel))
                seg_start += seg_bytes
                rel = 0
                run_left = 0
            phy = seg_start + rel
            # The header in HEADER_LAYOUT order, then topic|born|store, then the payload.
            r = out + pos
            wr_u32(r, <uint32_t>size)
            wr_u32(r + 4, magic)
            wr_u32(r + 12, flags)
            wr_i32(r + 16, qid)
            wr_i64(r + 20, qoff)
            wr_i64(r + 28, phy)
            wr_i64(r + 36, born_ts)
            wr_i64(r + 44, ts_c)
            wr_i64(r + 52, prepared_c)
            wr_i32(r + 60, reconsume_c)
            wr_i64(r + 64, th)
            memcpy(r + 72, msg_id, 16)
            r[88] = topic_len
            r[89] = born_len
            r[90] = store_len
            r[91] = 0
            wr_u16(r + 92, tags_len)
            wr_u16(r + 94, keys_len)
            wr_u32(r + 96, props_len)
            wr_u32(r + 100, body_len)
            memcpy(r + header_size, pre, prefix_len)
            memcpy(r + payload_at, e + entry_size, length - entry_size)
            wr_u32(r + 8, ferry_crc32c(0, r + 12, size - 12))
            pos = end
            rel += size
            wr_i64(cq, phy)
            wr_i32(cq + 8, <int32_t>size)
            wr_i64(cq + 12, th)
            entries.append(PyBytes_FromStringAndSize(<char *>cq, 20))
            window_byte = msg_id[run_cut] >> low_bits
            if exact_all or flags & exact_flags:  # its exact key; the run (if any) ends here
                items.append((ferry_crc32c(id_crc, msg_id, 16), phy, ts_o))
                run_left = 0
            elif (run_left and window_byte == run_high
                  and memcmp(msg_id, run_prefix, run_cut) == 0):
                run_left -= 1
            else:  # the first record of an id run: its index key
                crc = ferry_crc32c(run_crc, msg_id, run_cut)
                items.append((ferry_crc32c(crc, &window_byte, 1), phy, ts_o))
                memcpy(run_prefix, msg_id, run_cut)
                run_high = window_byte
                run_left = max_run - 1
            if keys_len:
                k_at = p + tags_len
                k_end = k_at + keys_len
                for i in range(k_at, k_end):
                    if src[i] >= 0x80:  # stored keys are decoded as text: refuse what is not UTF-8
                        keys_b = PyBytes_FromStringAndSize(<const char *>src + k_at, keys_len)
                        keys_b.decode()
                        break
                i = k_at
                while i < k_end:   # the keys, split at single spaces, each but empty ones
                    if src[i] == 32:
                        if i > k_at:
                            items.append((ferry_crc32c(key_crc, src + k_at, i - k_at), phy, ts_o))
                        k_at = i + 1
                    i += 1
                if k_end > k_at:
                    items.append((ferry_crc32c(key_crc, src + k_at, k_end - k_at), phy, ts_o))
            qoff += 1
            at += length
        if qoff == first_qoff:
            raise MalformedRequestError("the message batch is empty")
        q.next_offset = qoff
        st.seg_start, st.rel, st.pos = seg_start, rel, pos
        return qoff - first_qoff
    finally:
        PyBuffer_Release(&pb)
