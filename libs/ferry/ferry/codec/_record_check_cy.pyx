# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The native twin of `ferry.codec.record_check` (Cython, hand-written): the record check
of a plain read, `check_records(view, off, end, SIZE_MAGIC_CRC)`, in C.

That call is what the store runs over every record it serves (`get_messages`'s span
check) and what Spark's source runs over every record of an unchecked PULL. Per record
the pure loop (and its mypyc twin, which gains nothing here) unpacks a `struct`, slices
a memoryview and calls `crc32c`, about 0.35 µs whatever the record's length; here the
three fields are read in place and CRC32C runs with the CPU's instruction (SSE 4.2).

Every other call (a full `HEADER` check, as the client's PULL decoder, recovery and
replication make; a view that is not flat; offsets past 62 bits) and `check_record` and
`decode_record` are the mypyc twin's when it is built from the same source, else the pure
module's. Same results and the same errors, word for word
(`tests/codec/test_record_check_twin.py`). `MIRRORS_SHA256` is the SHA-256 of the
`record_check.py` this file mirrors: after an edit of it `ferry.extensions` refuses
this twin until it is checked against the edit and the hash updated.
"""
import importlib

from libc.stdint cimport int64_t, uint32_t
from libc.string cimport memcpy
from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer

cdef extern from "native_crc32c.h":
    int ferry_crc_hw()
    uint32_t ferry_crc32c(uint32_t value, const unsigned char *p, size_t n)
    int ferry_little_endian()

from ferry import extensions
from ferry.codec.record_layout import CRC_START, HEADER, HEADER_SIZE, RECORD_MAGIC, SIZE_MAGIC_CRC
from ferry.errors import CorruptRecordError

if not ferry_crc_hw() or not ferry_little_endian():
    raise ImportError("the native record check needs x86-64 with SSE 4.2 (CRC32C)")
if CRC_START != 12 or SIZE_MAGIC_CRC.format != "<III":
    raise ImportError("the record layout is not the one this twin reads")

#: SHA-256 of the ferry/codec/record_check.py this file mirrors (see the docstring).
MIRRORS_SHA256 = "5d91999c524958adf1bcb8add89821b2fe5a3ca5503511e16378a91ab4035286"
_PURE = "ferry.codec.record_check"


def _best(name):
    """`name` of the mypyc twin when it was built from the source this file mirrors, else
    of the pure module."""
    try:
        twin = importlib.import_module(extensions.TWINS[_PURE])
    except ImportError:
        twin = None
    if twin is not None and getattr(twin, extensions.SOURCE_HASH_NAME, None) == MIRRORS_SHA256:
        return getattr(twin, name)
    return extensions.pure(_PURE, name)


_check_records_other = _best("check_records")
check_record = _best("check_record")
decode_record = _best("decode_record")
cdef object _SIZE_MAGIC_CRC = SIZE_MAGIC_CRC
cdef object _LIMIT = 1 << 62
cdef uint32_t _MAGIC = RECORD_MAGIC
cdef int64_t _HEADER_SIZE = HEADER_SIZE


def check_records(view, off, end, layout=HEADER):
    """`ferry.codec.record_check.check_records`: natively for SIZE_MAGIC_CRC over a flat
    memoryview, else the mypyc twin's (or the pure) check."""
    if (layout is not _SIZE_MAGIC_CRC or type(view) is not memoryview or type(off) is not int
            or type(end) is not int or not 0 <= off < _LIMIT or not -_LIMIT < end < _LIMIT
            or not view.c_contiguous or view.itemsize != 1):
        return _check_records_other(view, off, end, layout)
    cdef Py_buffer pb
    PyObject_GetBuffer(view, &pb, PyBUF_SIMPLE)
    cdef const unsigned char *p = <const unsigned char *>pb.buf
    cdef int64_t n = pb.len
    cdef int64_t o = off
    cdef int64_t e = end
    cdef int64_t nxt, hi
    cdef uint32_t size, magic, crc
    cdef list heads = []
    try:
        while o < e:
            if n - o < 12:
                raise CorruptRecordError(f"truncated record header at {o}")
            memcpy(&size, p + o, 4)
            memcpy(&magic, p + o + 4, 4)
            memcpy(&crc, p + o + 8, 4)
            nxt = o + size
            if magic != _MAGIC:
                raise CorruptRecordError(f"bad record magic {magic:#x} at {o}")
            if nxt > e or size < _HEADER_SIZE:
                raise CorruptRecordError(f"record size {size} at {o} is out of bounds")
            hi = nxt if nxt < n else n   # a record past the view: its CRC over what is there
            if ferry_crc32c(0, p + o + 12, hi - o - 12) != crc:
                raise CorruptRecordError(f"record crc mismatch at {o}")
            heads.append((size, magic, crc))
            o = nxt
    finally:
        PyBuffer_Release(&pb)
    return heads
