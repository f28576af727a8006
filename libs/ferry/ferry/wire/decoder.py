"""The sans-IO frame parser: bytes in, whole frames out.

It never reads a socket: the connection code feeds it what arrived and gets
back every complete frame. Every length is checked as soon as its 4 bytes are
in, before anything is buffered for it, so a peer announcing a 2 GiB frame is
refused after 4 bytes rather than after 2 GiB.
"""
from __future__ import annotations

import msgpack

from ferry import extensions
from ferry.wire.codes import MAX_FRAME_BYTES, MAX_HEADER_BYTES, MAX_REQUEST_ID, PROTOCOL_VERSION
from ferry.wire.frame import (
    FRAME_LENGTH,
    FRAME_PREFIX,
    HEADER_LENGTH_SIZE,
    Frame,
    MalformedFrameError,
)

_PREFIX_SIZE = FRAME_PREFIX.size  # 8: frame_length + header_length
_LENGTH_SIZE = FRAME_LENGTH.size  # 4: frame_length alone
_OK = 0


class FrameDecoder:
    """Turns a byte stream into Frames; one decoder per connection.

    After a MalformedFrameError the stream has lost its framing: the decoder
    stays failed and the caller must close the connection.

    By default every body is a `bytes` copy. With `body_views=True` a body is
    a read-only memoryview instead, into the `bytes` chunk it arrived in or
    into the decoder's own buffer of a frame that spanned several chunks (that
    buffer is then handed over, not reused), which saves copying large bodies;
    bodies from a mutable chunk (bytearray, memoryview) are still copied,
    since the caller may reuse it.
    """

    __slots__ = ("_buf", "_failed", "max_frame_bytes", "_body_views", "_alias")

    def __init__(self, max_frame_bytes: int = MAX_FRAME_BYTES, *,
                 body_views: bool = False) -> None:
        self.max_frame_bytes = max_frame_bytes
        self._body_views = body_views
        self._alias = False  # whether the chunk being parsed may be referenced by bodies
        # Bytes of the one incomplete frame, if any. Whole frames are parsed
        # straight from the caller's chunk, so nothing else is ever buffered
        # and nothing is copied twice.
        self._buf = bytearray()
        self._failed: str | None = None

    @property
    def buffered_bytes(self) -> int:
        """Bytes held for a frame that has not fully arrived."""
        return len(self._buf)

    @property
    def pending_frame_bytes(self) -> int:
        """The whole size (length prefix included) announced by the incomplete frame held.

        0 when none is held; the bytes held while even its 4-byte length is incomplete.
        A server can budget for the frame from this before its bytes arrive.
        """
        buf = self._buf
        if len(buf) < _LENGTH_SIZE:
            return len(buf)
        return _LENGTH_SIZE + int(FRAME_LENGTH.unpack_from(buf)[0])

    def feed(self, data: bytes | bytearray | memoryview) -> list[Frame]:
        """Take the next bytes of the stream; return every frame now complete, in order."""
        if self._failed is not None:
            raise MalformedFrameError(f"stream already failed: {self._failed}")
        self._alias = self._body_views and type(data) is bytes
        try:
            with memoryview(data) as view:
                return self._feed(view)
        except MalformedFrameError as exc:
            self._failed = str(exc)
            self._buf.clear()
            raise

    def _feed(self, view: memoryview) -> list[Frame]:
        frames: list[Frame] = []
        start = 0
        if self._buf:
            # Finish the pending frame with just the bytes it lacks, so the
            # rest of the chunk is parsed in place rather than copied first.
            start = self._complete_pending(view, frames)
            if self._buf:
                return frames
        used = self._parse(view, start, frames)
        if used < view.nbytes:
            self._buf += view[used:]  # only the tail of one incomplete frame
        return frames

    def _complete_pending(self, view: memoryview, frames: list[Frame]) -> int:
        """Move bytes from `view` into the pending frame; decode it once whole. Bytes taken."""
        buf = self._buf
        taken = 0
        while True:
            have = len(buf)
            if have < _LENGTH_SIZE:
                target = _LENGTH_SIZE
            else:
                frame_length = FRAME_LENGTH.unpack_from(buf)[0]
                self._check_frame_length(frame_length)
                target = _PREFIX_SIZE
                if have >= _PREFIX_SIZE:
                    self._check_header_length(frame_length, FRAME_PREFIX.unpack_from(buf)[1])
                    target = _LENGTH_SIZE + frame_length
            if have >= target:
                break
            take = min(target - have, view.nbytes - taken)
            if take == 0:
                return taken
            buf += view[taken:taken + take]
            taken += take
        if self._body_views:
            # The bodies may point into this buffer: hand it over, start a new one.
            self._buf = bytearray()
            alias, self._alias = self._alias, True
            self._parse(memoryview(buf).toreadonly(), 0, frames)
            self._alias = alias
        else:
            with memoryview(buf) as pending:
                self._parse(pending, 0, frames)
            buf.clear()
        return taken

    def _parse(self, view: memoryview, pos: int, frames: list[Frame]) -> int:
        """Decode whole frames from `view[pos:]` into `frames`; return where the rest starts."""
        end = view.nbytes
        alias = self._alias
        while end - pos >= _LENGTH_SIZE:
            frame_length = FRAME_LENGTH.unpack_from(view, pos)[0]
            self._check_frame_length(frame_length)
            if end - pos < _PREFIX_SIZE:
                break
            header_length = FRAME_PREFIX.unpack_from(view, pos)[1]
            self._check_header_length(frame_length, header_length)
            frame_end = pos + _LENGTH_SIZE + frame_length
            if frame_end > end:
                break
            header_start = pos + _PREFIX_SIZE
            body_start = header_start + header_length
            if frame_end <= body_start:
                body: bytes | memoryview = b""
            elif alias:
                body = view[body_start:frame_end]
            else:
                body = view[body_start:frame_end].tobytes()
            with view[header_start:body_start] as header:
                frames.append(decode_header(header, body))
            pos = frame_end
        return pos

    def _check_frame_length(self, frame_length: int) -> None:
        if frame_length > self.max_frame_bytes:
            raise MalformedFrameError(
                f"frame of {frame_length} bytes announced; the limit is {self.max_frame_bytes}"
            )
        if frame_length < HEADER_LENGTH_SIZE:
            raise MalformedFrameError(
                f"frame length {frame_length} is shorter than its header length field"
            )

    @staticmethod
    def _check_header_length(frame_length: int, header_length: int) -> None:
        if header_length > frame_length - HEADER_LENGTH_SIZE:
            raise MalformedFrameError(
                f"header length {header_length} does not fit in a frame of {frame_length} bytes"
            )
        if header_length > MAX_HEADER_BYTES:
            raise MalformedFrameError(
                f"header of {header_length} bytes; the limit is {MAX_HEADER_BYTES}"
            )


def decode_header(raw: bytes | bytearray | memoryview, body: bytes | memoryview) -> Frame:
    """Build the Frame from a header's bytes and its body, or raise MalformedFrameError."""
    try:
        header = msgpack.unpackb(raw)
    except Exception as exc:  # msgpack raises several unrelated types on garbage
        raise MalformedFrameError(f"frame header is not valid msgpack: {exc}") from None
    if type(header) is not dict:
        raise MalformedFrameError(f"frame header is a {type(header).__name__}, not a map")
    version = header.get("v")
    request_id = header.get("id")
    code = header.get("c")
    flags = header.get("f")
    if type(version) is not int or type(request_id) is not int:
        raise MalformedFrameError("frame header needs integer 'v' and 'id'")
    if type(code) is not int or type(flags) is not int:
        raise MalformedFrameError("frame header needs integer 'c' and 'f'")
    if version != PROTOCOL_VERSION:
        raise MalformedFrameError(
            f"unsupported protocol version {version}; this side speaks {PROTOCOL_VERSION}"
        )
    if not 0 <= request_id <= MAX_REQUEST_ID:
        raise MalformedFrameError(f"request id {request_id} is not a u32")
    error = header.get("e", _OK)
    message = header.get("m", "")
    fields = header.get("x")
    if type(error) is not int or type(message) is not str:
        raise MalformedFrameError("frame header 'e' must be an integer and 'm' a string")
    if fields is None:
        fields = {}
    elif type(fields) is not dict or not all(type(k) is str for k in fields):
        raise MalformedFrameError("frame header 'x' must be a map with string keys")
    return Frame(code, request_id, flags, error, message, fields, body, version,
                 header.get("a"))


def decode_frame(data: bytes | bytearray | memoryview) -> Frame:
    """Decode exactly one complete frame (tests, tools); raise MalformedFrameError otherwise."""
    decoder = FrameDecoder()
    frames = decoder.feed(data)
    if len(frames) != 1 or decoder.buffered_bytes:
        raise MalformedFrameError(
            f"expected exactly one frame, got {len(frames)} and {decoder.buffered_bytes} "
            "bytes left over"
        )
    return frames[0]


# -- compiled twin: the build compiles this file down to here --
# (decode_header and decode_frame stay: the twin's FrameDecoder calls its own decode_header,
# the pure one the pure one, so each path is whole; decode_frame uses the running class.)
extensions.install(globals(), ("FrameDecoder",))
