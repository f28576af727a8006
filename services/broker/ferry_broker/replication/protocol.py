"""The replication link's frames: their layout, a sans-IO codec and a bounded reader
(the slave's copy-free reader is `link.py`).

Every frame (all integers little-endian)::

    length u32 (bytes after this field: type + payload) | type u8 | payload

`length` is checked against MAX_FRAME_BYTES before anything is read or
allocated. Payloads by type (docs/replication.md "Protocol" has the tables):

    HELLO     slave -> master  magic u32 | version u16 | broker_id i64 | epoch i64
                               | end_offset i64 | cluster str16 | name str16 | entries
    WELCOME   master -> slave  epoch i64 | start_offset i64 | master_end i64 | entries
    REFUSE    master -> slave  epoch i64 | reason str16           (then the master closes)
    DATA      master -> slave  phy_offset i64 | master_end i64 | commit-log bytes
    ACK       slave -> master  end_offset i64
    HEARTBEAT master -> slave  master_end i64
    OFFSETS   master -> slave  a batch of consumer-offset entries (ferry_broker.offsets_codec,
                               JSON version 2; at most CHUNK_BYTES)
    EPOCHS    master -> slave  entries
    AUTH      slave -> master  ts_ms i64 | nonce 16 | signature 32 | hello_sha256 32
                               | access_key str16   (the FIRST frame of a slave with
                               credentials, before its HELLO; it signs the master's
                               name and the HELLO's digest: docs/security.md)

    str16   := len u16 | UTF-8 bytes
    entries := count u32 | count x (epoch i64, start_offset i64)

Only HELLO carries the magic and version: it is the first frame of every link (after
the AUTH of a slave with credentials), so a peer speaking anything else is caught there.
Until a master has judged the peer, a frame may hold at most MAX_AUTH_BYTES (AUTH) or
MAX_HELLO_BYTES (HELLO): what a stranger can make it buffer is small.
"""
from __future__ import annotations

import asyncio
import enum
import struct
from dataclasses import dataclass

from ferry.errors import MalformedRequestError

MAGIC = 0x52595246  # b"FRYR"
VERSION = 1
#: Largest `length` of a frame; a DATA chunk is far smaller (CHUNK_BYTES), but one
#: record may exceed a chunk.
MAX_FRAME_BYTES = 16 << 20
#: Bytes of commit log the master reads for one DATA frame (at least one record); also
#: the most one OFFSETS frame's batch of entries takes.
CHUNK_BYTES = 1 << 20
#: Largest str16 field a HELLO or REFUSE may carry (cluster, name, reason).
MAX_TEXT_BYTES = 1024
#: Largest `length` of an AUTH frame (an access key is at most 64 bytes): the only
#: frame a master with auth on reads from a peer it has not authenticated.
MAX_AUTH_BYTES = 256
#: Largest `length` of a HELLO: two names and about 65,000 epoch entries (one per
#: master term that wrote), read only once the peer is authenticated (auth on).
MAX_HELLO_BYTES = 1 << 20

LENGTH = struct.Struct("<I")
TYPE = struct.Struct("<B")
HELLO_HEAD = struct.Struct("<IHqqq")  # magic, version, broker_id, epoch, end_offset
WELCOME_HEAD = struct.Struct("<qqq")  # epoch, start_offset, master_end
DATA_HEAD = struct.Struct("<qq")  # phy_offset, master_end
I64 = struct.Struct("<q")
U16 = struct.Struct("<H")
COUNT = struct.Struct("<I")
ENTRY = struct.Struct("<qq")  # epoch, start_offset
#: ts_ms, nonce, signature, hello_sha256 (then access_key str16)
AUTH_HEAD = struct.Struct("<q16s32s32s")

Entry = tuple[int, int]


class FrameType(enum.IntEnum):
    """The type byte of a frame."""

    HELLO = 1
    WELCOME = 2
    REFUSE = 3
    DATA = 4
    ACK = 5
    HEARTBEAT = 6
    OFFSETS = 7
    EPOCHS = 8
    AUTH = 9


class ReplicationProtocolError(MalformedRequestError):
    """The bytes on a replication link are no valid frame: the link closes."""


@dataclass(frozen=True, slots=True)
class Hello:
    """A slave's opening: who it is, which epoch it follows, what its log holds."""

    magic: int
    version: int
    broker_id: int
    epoch: int
    end_offset: int
    cluster: str
    name: str
    entries: list[Entry]


@dataclass(frozen=True, slots=True)
class Welcome:
    """The master's answer: stream starts at `start_offset`; its epoch entries."""

    epoch: int
    start_offset: int
    master_end: int
    entries: list[Entry]


# -- encoding ------------------------------------------------------------------------------


def frame(ftype: FrameType, *parts: bytes | memoryview) -> list[bytes | memoryview]:
    """The buffers of one frame (for writer.writelines: a DATA chunk is not copied)."""
    size = TYPE.size + sum(len(p) for p in parts)
    if size > MAX_FRAME_BYTES:
        raise ReplicationProtocolError(f"a {ftype.name} frame of {size} bytes exceeds "
                                       f"{MAX_FRAME_BYTES}")
    return [LENGTH.pack(size) + TYPE.pack(ftype), *parts]


def _str16(text: str) -> bytes:
    raw = text.encode()[:MAX_TEXT_BYTES]
    return U16.pack(len(raw)) + raw


def _entries(entries: list[Entry]) -> bytes:
    return COUNT.pack(len(entries)) + b"".join(ENTRY.pack(e, s) for e, s in entries)


def encode_hello(h: Hello) -> list[bytes | memoryview]:
    return frame(FrameType.HELLO, HELLO_HEAD.pack(h.magic, h.version, h.broker_id, h.epoch,
                                                  h.end_offset),
                 _str16(h.cluster), _str16(h.name), _entries(h.entries))


def encode_welcome(w: Welcome) -> list[bytes | memoryview]:
    return frame(FrameType.WELCOME, WELCOME_HEAD.pack(w.epoch, w.start_offset, w.master_end),
                 _entries(w.entries))


def encode_refuse(epoch: int, reason: str) -> list[bytes | memoryview]:
    return frame(FrameType.REFUSE, I64.pack(epoch), _str16(reason))


def encode_data(phy_offset: int, master_end: int, chunk: bytes) -> list[bytes | memoryview]:
    return frame(FrameType.DATA, DATA_HEAD.pack(phy_offset, master_end), chunk)


def encode_offset(ftype: FrameType, offset: int) -> list[bytes | memoryview]:
    """An ACK (the slave's end) or a HEARTBEAT (the master's end)."""
    return frame(ftype, I64.pack(offset))


def encode_epochs(entries: list[Entry]) -> list[bytes | memoryview]:
    return frame(FrameType.EPOCHS, _entries(entries))


# -- decoding ------------------------------------------------------------------------------


class _Cursor:
    """Reads fields off a payload in order; every read is bounds-checked."""

    def __init__(self, what: str, buf: bytes | memoryview) -> None:
        self.what, self.buf, self.pos = what, buf, 0

    def take(self, st: struct.Struct) -> tuple:
        if self.pos + st.size > len(self.buf):
            raise ReplicationProtocolError(f"{self.what} frame is truncated")
        out = st.unpack_from(self.buf, self.pos)
        self.pos += st.size
        return out

    def text(self) -> str:
        (n,) = self.take(U16)
        if n > MAX_TEXT_BYTES or self.pos + n > len(self.buf):
            raise ReplicationProtocolError(f"{self.what} frame has a bad text length {n}")
        raw = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        try:
            return raw.decode()
        except UnicodeDecodeError as exc:
            raise ReplicationProtocolError(f"{self.what} frame text is not UTF-8") from exc

    def entries(self) -> list[Entry]:
        (count,) = self.take(COUNT)
        if count * ENTRY.size != len(self.buf) - self.pos:
            raise ReplicationProtocolError(f"{self.what} frame holds {count} epoch entries "
                                           f"but {len(self.buf) - self.pos} bytes for them")
        out = [(int(e), int(s)) for e, s in ENTRY.iter_unpack(self.buf[self.pos:])]
        self.pos = len(self.buf)
        return out

    def done(self) -> None:
        if self.pos != len(self.buf):
            raise ReplicationProtocolError(f"{self.what} frame has {len(self.buf) - self.pos} "
                                           "bytes too many")


def decode_hello(payload: bytes | memoryview) -> Hello:
    """A HELLO; magic and version are returned, not judged (the server answers them)."""
    c = _Cursor("HELLO", payload)
    magic, version, broker_id, epoch, end = c.take(HELLO_HEAD)
    if magic != MAGIC:
        raise ReplicationProtocolError(f"HELLO has a bad magic {magic:#x}")
    if broker_id < 0 or epoch < 0 or end < 0:
        raise ReplicationProtocolError(f"HELLO has a negative id, epoch or offset "
                                       f"({broker_id}, {epoch}, {end})")
    cluster, name = c.text(), c.text()
    return Hello(magic, version, broker_id, epoch, end, cluster, name, c.entries())


def decode_welcome(payload: bytes | memoryview) -> Welcome:
    c = _Cursor("WELCOME", payload)
    epoch, start, master_end = c.take(WELCOME_HEAD)
    return Welcome(epoch, start, master_end, c.entries())


def decode_refuse(payload: bytes | memoryview) -> tuple[int, str]:
    """(master epoch, reason) of a REFUSE."""
    c = _Cursor("REFUSE", payload)
    (epoch,) = c.take(I64)
    reason = c.text()
    c.done()
    return epoch, reason


def decode_data(payload: bytes | memoryview) -> tuple[int, int, memoryview]:
    """(phy_offset, master_end, chunk) of a DATA frame; the chunk is a view, not a copy."""
    c = _Cursor("DATA", payload)
    phy, master_end = c.take(DATA_HEAD)
    return phy, master_end, memoryview(payload)[DATA_HEAD.size:]


def encode_auth(access_key: str, ts_ms: int, nonce: bytes, signature: bytes,
                hello_sha256: bytes) -> list[bytes | memoryview]:
    return frame(FrameType.AUTH, AUTH_HEAD.pack(ts_ms, nonce, signature, hello_sha256),
                 _str16(access_key))


@dataclass(frozen=True, slots=True)
class Auth:
    """A slave's AUTH frame: who signs, when, and the digest of the HELLO it vouches for."""

    access_key: str
    ts_ms: int
    nonce: bytes
    signature: bytes
    hello_sha256: bytes


def decode_auth(payload: bytes | memoryview) -> Auth:
    c = _Cursor("AUTH", payload)
    ts_ms, nonce, signature, hello_sha256 = c.take(AUTH_HEAD)
    access_key = c.text()
    c.done()
    return Auth(access_key, int(ts_ms), bytes(nonce), bytes(signature), bytes(hello_sha256))


def master_target(cluster: str, name: str, broker_id: int) -> str:
    """The master an AUTH frame is addressed to, as its signature names it."""
    return f"{cluster}/{name}/{broker_id}"


def decode_offset(what: str, payload: bytes | memoryview) -> int:
    """The i64 of an ACK or a HEARTBEAT."""
    c = _Cursor(what, payload)
    (value,) = c.take(I64)
    c.done()
    return int(value)


def decode_epochs(payload: bytes | memoryview) -> list[Entry]:
    return _Cursor("EPOCHS", payload).entries()


# -- reading from a stream -----------------------------------------------------------------


async def read_head(reader: asyncio.StreamReader) -> tuple[FrameType, int]:
    """The next frame's type and payload size, its payload not read yet.

    ReplicationProtocolError for an oversized or empty length or an unknown type;
    asyncio.IncompleteReadError when the peer closes mid-frame (or before one).
    """
    (size,) = LENGTH.unpack(await reader.readexactly(LENGTH.size))
    if not TYPE.size <= size <= MAX_FRAME_BYTES:
        raise ReplicationProtocolError(f"frame length {size} is outside 1..{MAX_FRAME_BYTES}")
    (raw_type,) = TYPE.unpack(await reader.readexactly(TYPE.size))
    try:
        ftype = FrameType(raw_type)
    except ValueError:
        raise ReplicationProtocolError(f"unknown frame type {raw_type}") from None
    return ftype, size - TYPE.size


async def read_payload(reader: asyncio.StreamReader, ftype: FrameType, size: int,
                       max_bytes: int) -> bytes:
    """The payload of a frame whose head was read, once its size is within `max_bytes`."""
    if size > max_bytes:
        raise ReplicationProtocolError(f"a {ftype.name} frame of {size} bytes here exceeds "
                                       f"{max_bytes}")
    return await reader.readexactly(size)


async def read_frame(reader: asyncio.StreamReader) -> tuple[FrameType, bytes]:
    """The next frame's (type, payload); the length is bounded before the payload is read
    (errors as `read_head`)."""
    ftype, size = await read_head(reader)
    return ftype, await reader.readexactly(size)
