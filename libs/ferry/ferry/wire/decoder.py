"""The sans-IO frame parser: bytes in, whole frames out.

It never reads a socket: the connection code feeds it what arrived and gets
back every complete frame. Every length is checked as soon as its 4 bytes are
in, before anything is buffered for it, so a peer announcing a 2 GiB frame is
refused after 4 bytes rather than after 2 GiB.
"""
from __future__ import annotations

from ferry.wire.codes import MAX_FRAME_BYTES, MAX_HEADER_BYTES
from ferry.wire.frame import (
    FRAME_LENGTH,
    FRAME_PREFIX,
    HEADER_LENGTH_SIZE,
    Frame,
    MalformedFrameError,
    decode_header,
)

_PREFIX_SIZE = FRAME_PREFIX.size  # 8: frame_length + header_length
_LENGTH_SIZE = FRAME_LENGTH.size  # 4: frame_length alone


class FrameDecoder:
    """Turns a byte stream into Frames; one decoder per connection.

    After a MalformedFrameError the stream has lost its framing: the decoder
    stays failed and the caller must close the connection.
    """

    __slots__ = ("_buf", "_failed", "max_frame_bytes")

    def __init__(self, max_frame_bytes: int = MAX_FRAME_BYTES) -> None:
        self.max_frame_bytes = max_frame_bytes
        # Bytes of an incomplete frame. Complete frames are parsed straight
        # from the caller's chunk when nothing is pending, so this only ever
        # holds the tail of one frame.
        self._buf = bytearray()
        self._failed: str | None = None

    @property
    def buffered_bytes(self) -> int:
        """Bytes held for a frame that has not fully arrived."""
        return len(self._buf)

    def feed(self, data: bytes | bytearray | memoryview) -> list[Frame]:
        """Take the next bytes of the stream; return every frame now complete, in order."""
        if self._failed is not None:
            raise MalformedFrameError(f"stream already failed: {self._failed}")
        buf = self._buf
        try:
            if not buf:
                # Fast path: no pending tail, parse the chunk in place and keep
                # only its incomplete end.
                frames, used = self._parse(data)
                if used < len(data):
                    with memoryview(data) as view:
                        buf += view[used:]
                return frames
            buf += data
            frames, used = self._parse(buf)
            if used:
                # Drops consumed frames; what moves is at most the tail of the
                # last chunk, so the total copying stays linear in the stream.
                del buf[:used]
            return frames
        except MalformedFrameError as exc:
            self._failed = str(exc)
            buf.clear()
            raise

    def _parse(self, src: bytes | bytearray | memoryview) -> tuple[list[Frame], int]:
        """Decode whole frames from the start of `src`; return them and the bytes used."""
        frames: list[Frame] = []
        pos = 0
        with memoryview(src) as view:
            end = view.nbytes
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
                body = view[body_start:frame_end].tobytes() if frame_end > body_start else b""
                header = view[header_start:body_start]
                try:
                    frames.append(decode_header(header, body))
                finally:
                    header.release()  # so the bytearray can be resized afterwards
                pos = frame_end
        return frames, pos

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
