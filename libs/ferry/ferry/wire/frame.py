"""One frame of the Ferry wire protocol: the value, its header codec and its encoder.

A frame on the wire (all integers little-endian):

    0         4         8                      8+header_length        4+frame_length
    +---------+---------+----------------------+----------------------+
    | u32     | u32     | header               | body                 |
    | frame_  | header_ | msgpack map          | opaque bytes         |
    | length  | length  | {v,id,c,f,e,m,x}     | (code-specific)      |
    +---------+---------+----------------------+----------------------+

`frame_length` counts every byte after its own field (header_length field,
header and body), so a reader knows the whole frame's size from 4 bytes.
Header keys: `v` version, `id` request id, `c` request code, `f` flags, and
only when not their default: `e` error code (0), `m` error message (""),
`x` the code's own fields ({}), `a` the request's signature (none; see
docs/security.md). Omitting defaults keeps the header of the common request
at a dozen bytes.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

import msgpack

from ferry.errors import MalformedRequestError, MessageTooLargeError
from ferry.wire.codes import (
    MAX_FRAME_BYTES,
    MAX_HEADER_BYTES,
    MAX_REQUEST_ID,
    PROTOCOL_VERSION,
    Flag,
)

#: The 8-byte prefix: u32 frame_length | u32 header_length.
FRAME_PREFIX = struct.Struct("<II")
FRAME_PREFIX_FIELDS = ("frame_length", "header_length")
#: The first field alone, read before the rest has arrived.
FRAME_LENGTH = struct.Struct("<I")
#: Bytes that frame_length covers besides header and body: the header_length field.
HEADER_LENGTH_SIZE = 4

#: Every header key; `v`, `id`, `c` and `f` are always present.
HEADER_KEYS = ("v", "id", "c", "f", "e", "m", "x", "a")


class MalformedFrameError(MalformedRequestError):
    """The bytes are not a valid frame; the stream cannot be trusted, so the connection closes."""


@dataclass(slots=True)
class Frame:
    """A request or a response: header values, the code's fields and the body.

    `fields` is the header's `x` map (names per request code in
    docs/protocol.md); `body` is opaque here (a SEND batch, stored records).
    """

    code: int
    request_id: int
    flags: int = 0
    error: int = 0
    message: str = ""
    fields: dict[str, Any] = field(default_factory=dict)
    body: bytes | memoryview = b""
    version: int = PROTOCOL_VERSION
    #: The header's `a` value: a signed request's {k, t, n, s} (ferry.auth.signing), as
    #: decoded; checked only by a server with auth on. None when absent.
    auth: Any = None

    @property
    def is_response(self) -> bool:
        """Whether this frame answers a request."""
        return bool(self.flags & Flag.RESPONSE)

    @property
    def is_oneway(self) -> bool:
        """Whether the requester asked for no response."""
        return bool(self.flags & Flag.ONEWAY)


def encode_header(frame: Frame) -> bytes:
    """The msgpack header of `frame`, leaving out keys at their default."""
    if not 0 <= frame.request_id <= MAX_REQUEST_ID:
        raise MalformedRequestError(f"request id {frame.request_id} is not a u32")
    header: dict[str, Any] = {
        "v": frame.version,
        "id": frame.request_id,
        "c": int(frame.code),
        "f": int(frame.flags),
    }
    if frame.error:
        header["e"] = int(frame.error)
    if frame.message:
        header["m"] = frame.message
    if frame.fields:
        header["x"] = frame.fields
    if frame.auth is not None:
        header["a"] = frame.auth
    try:
        return msgpack.packb(header)
    except (TypeError, ValueError, OverflowError) as exc:
        raise MalformedRequestError(f"frame fields cannot be encoded: {exc}") from None


def encode_frame_parts(
    frame: Frame, max_frame_bytes: int = MAX_FRAME_BYTES
) -> list[bytes | memoryview]:
    """The frame as a list of buffers for `writelines`: the body is not copied.

    Raises MessageTooLargeError when the header or the whole frame is over its limit.
    """
    header = encode_header(frame)
    header_length = len(header)
    if header_length > MAX_HEADER_BYTES:
        raise MessageTooLargeError(
            f"frame header is {header_length} bytes; the limit is {MAX_HEADER_BYTES}"
        )
    body = frame.body
    body_length = len(body) if type(body) is bytes else memoryview(body).nbytes
    frame_length = HEADER_LENGTH_SIZE + header_length + body_length
    if frame_length > max_frame_bytes:
        raise MessageTooLargeError(
            f"frame is {frame_length} bytes; the limit is {max_frame_bytes}"
        )
    head = FRAME_PREFIX.pack(frame_length, header_length) + header
    if body_length == 0:
        return [head]
    return [head, body]


def encode_frame(frame: Frame, max_frame_bytes: int = MAX_FRAME_BYTES) -> bytes:
    """The frame as one bytes object (copies the body; see encode_frame_parts)."""
    return b"".join(encode_frame_parts(frame, max_frame_bytes))


def describe(frame: Frame) -> str:
    """A short one-line description for logs (never the body)."""
    kind = "response" if frame.is_response else ("oneway" if frame.is_oneway else "request")
    err = f" e={frame.error}" if frame.error else ""
    return f"<{kind} c={frame.code} id={frame.request_id}{err} body={len(frame.body)}B>"

