"""Frame encoding and the sans-IO FrameDecoder: round trips, chunking, hostile input."""
from __future__ import annotations

import os
import random
import struct
import tracemalloc

import msgpack
import pytest
from ferry.errors import MalformedRequestError, MessageTooLargeError
from ferry.wire import (
    FRAME_PREFIX,
    MAX_FRAME_BYTES,
    MAX_HEADER_BYTES,
    Flag,
    Frame,
    FrameDecoder,
    MalformedFrameError,
    RequestCode,
    decode_frame,
    encode_frame,
    encode_frame_parts,
    request,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.wire.strategies import frames


def _raw(header: object, body: bytes = b"", *, header_bytes: bytes | None = None) -> bytes:
    """A frame built by hand, so tests can send what encode_frame refuses to make."""
    hb = msgpack.packb(header) if header_bytes is None else header_bytes
    return FRAME_PREFIX.pack(4 + len(hb) + len(body), len(hb)) + hb + body


@given(frames)
def test_round_trip(frame: Frame) -> None:
    assert decode_frame(encode_frame(frame)) == frame


@given(st.lists(frames, min_size=1, max_size=6), st.randoms(use_true_random=False))
@settings(max_examples=50)
def test_random_chunks_yield_the_same_frames(batch: list[Frame], rnd: random.Random) -> None:
    stream = b"".join(encode_frame(f) for f in batch)
    decoder = FrameDecoder()
    out: list[Frame] = []
    pos = 0
    while pos < len(stream):
        step = rnd.randint(1, 300)
        out += decoder.feed(stream[pos:pos + step])
        pos += step
        # Only the one incomplete frame is ever held.
        assert decoder.buffered_bytes < max(len(encode_frame(f)) for f in batch)
    assert out == batch
    assert decoder.buffered_bytes == 0


def test_byte_by_byte() -> None:
    batch = [request(RequestCode.SEND, i, {"topic": "t", "queue_id": i}, os.urandom(i * 7))
             for i in range(20)]
    stream = b"".join(encode_frame(f) for f in batch)
    decoder = FrameDecoder()
    out: list[Frame] = []
    for i in range(len(stream)):
        out += decoder.feed(stream[i:i + 1])
    assert out == batch


def test_feed_returns_every_complete_frame_and_keeps_the_tail() -> None:
    batch = [request(RequestCode.HEARTBEAT, i, {"client_id": "c"}) for i in range(5)]
    stream = b"".join(encode_frame(f) for f in batch)
    decoder = FrameDecoder()
    assert decoder.feed(stream[:-3]) == batch[:4]
    assert decoder.buffered_bytes == len(encode_frame(batch[4])) - 3
    assert decoder.feed(stream[-3:]) == batch[4:]
    assert decoder.buffered_bytes == 0


def test_memoryview_and_bytearray_input() -> None:
    frame = request(RequestCode.PULL, 9, {"topic": "t"}, b"x" * 100)
    raw = encode_frame(frame)
    assert FrameDecoder().feed(memoryview(raw)) == [frame]
    assert FrameDecoder().feed(bytearray(raw)) == [frame]


def test_parts_do_not_copy_the_body() -> None:
    body = os.urandom(1 << 20)
    parts = encode_frame_parts(request(RequestCode.SEND, 1, {}, body))
    assert parts[-1] is body
    assert b"".join(parts) == encode_frame(request(RequestCode.SEND, 1, {}, body))


def test_defaults_are_left_out_of_the_header() -> None:
    raw = encode_frame(request(RequestCode.HEARTBEAT, 5))
    header = msgpack.unpackb(raw[8:])
    assert header == {"v": 1, "id": 5, "c": 18, "f": 0}


def test_flags() -> None:
    frame = request(RequestCode.COMMIT_OFFSET, 1, {}, oneway=True)
    assert frame.is_oneway and not frame.is_response
    assert frame.flags == Flag.ONEWAY


def test_announced_2_gib_is_refused_before_buffering() -> None:
    decoder = FrameDecoder()
    with pytest.raises(MalformedFrameError, match="limit"):
        decoder.feed(struct.pack("<II", 2**31, 10) + b"\0" * 4096)
    assert decoder.buffered_bytes == 0


@pytest.mark.parametrize("pending", [0, 1, 3])
def test_announced_2_gib_allocates_nothing(pending: int) -> None:
    """Refused from the length field alone, whether or not part of it arrived earlier."""
    prefix = struct.pack("<II", 2**31, 10)
    junk = prefix[pending:] + os.urandom(1 << 20)
    decoder = FrameDecoder()
    assert decoder.feed(prefix[:pending]) == []
    tracemalloc.start()
    try:
        with pytest.raises(MalformedFrameError):
            decoder.feed(junk)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 * 1024
    assert decoder.buffered_bytes == 0


def test_frames_do_not_alias_the_callers_buffer() -> None:
    """A reused receive buffer (BufferedProtocol) may change after feed returns."""
    frame = request(RequestCode.SEND, 1, {"topic": "t"}, b"payload" * 10)
    raw = encode_frame(frame)
    recv = bytearray(raw + raw[:20])
    decoder = FrameDecoder()
    got = decoder.feed(memoryview(recv))
    recv[:] = bytes(len(recv))
    assert got == [frame]
    assert decoder.feed(raw[20:]) == [frame]


def test_oversized_length_refused_from_its_four_bytes_alone() -> None:
    decoder = FrameDecoder()
    assert decoder.feed(b"\x00") == []  # pending tail
    with pytest.raises(MalformedFrameError):
        decoder.feed(struct.pack("<I", 2**31)[1:])
    assert decoder.buffered_bytes == 0


def test_limit_is_inclusive() -> None:
    decoder = FrameDecoder(max_frame_bytes=100)
    good = _raw({"v": 1, "id": 1, "c": 10, "f": 0})
    body = b"z" * (100 - (len(good) - 4))
    assert len(decoder.feed(_raw({"v": 1, "id": 1, "c": 10, "f": 0}, body))) == 1
    with pytest.raises(MalformedFrameError):
        FrameDecoder(max_frame_bytes=100).feed(_raw({"v": 1, "id": 1, "c": 10, "f": 0}, body + b"!"))


@pytest.mark.parametrize("prefix", [
    struct.pack("<II", 3, 0),  # frame shorter than its header_length field
    struct.pack("<II", 20, 17),  # header longer than the frame
    struct.pack("<II", MAX_HEADER_BYTES + 100, MAX_HEADER_BYTES + 1),  # header over its limit
    struct.pack("<II", 4, 0),  # empty header: not a map
])
def test_bad_lengths(prefix: bytes) -> None:
    decoder = FrameDecoder()
    with pytest.raises(MalformedFrameError):
        decoder.feed(prefix + b"\x80" * 20)
    assert decoder.buffered_bytes == 0


@pytest.mark.parametrize("header", [
    [1, 2, 3],
    {"v": 1, "id": 1, "c": 10},  # no flags
    {"v": 1, "id": "1", "c": 10, "f": 0},
    {"v": 1, "id": 1, "c": 10, "f": True},
    {"v": 1, "id": -1, "c": 10, "f": 0},
    {"v": 1, "id": 2**32, "c": 10, "f": 0},
    {"v": 1, "id": 1, "c": 10, "f": 0, "x": [1]},
    {"v": 1, "id": 1, "c": 10, "f": 0, "x": {b"k": 1}},
    {"v": 1, "id": 1, "c": 10, "f": 0, "e": "x"},
    {"v": 1, "id": 1, "c": 10, "f": 0, "m": 5},
])
def test_bad_headers(header: object) -> None:
    with pytest.raises(MalformedFrameError):
        FrameDecoder().feed(_raw(header))


def test_header_with_trailing_garbage() -> None:
    hb = msgpack.packb({"v": 1, "id": 1, "c": 10, "f": 0}) + b"\xc1"
    with pytest.raises(MalformedFrameError, match="msgpack"):
        FrameDecoder().feed(_raw(None, header_bytes=hb))


def test_wrong_version_says_so() -> None:
    with pytest.raises(MalformedFrameError, match="version 2"):
        FrameDecoder().feed(_raw({"v": 2, "id": 1, "c": 10, "f": 0}))


def test_decoder_stays_failed() -> None:
    decoder = FrameDecoder()
    with pytest.raises(MalformedFrameError):
        decoder.feed(_raw({"v": 9, "id": 1, "c": 10, "f": 0}))
    with pytest.raises(MalformedFrameError, match="already failed"):
        decoder.feed(encode_frame(request(RequestCode.PULL, 1)))


def test_malformed_frame_is_a_malformed_request() -> None:
    assert issubclass(MalformedFrameError, MalformedRequestError)
    assert MalformedFrameError.code == MalformedRequestError.code == 4


@given(st.binary(min_size=1, max_size=512))
def test_random_bytes_never_crash(data: bytes) -> None:
    decoder = FrameDecoder()
    try:
        for frame in decoder.feed(data):
            assert isinstance(frame, Frame)
    except MalformedFrameError:
        assert decoder.buffered_bytes == 0
    assert decoder.buffered_bytes <= len(data)


def test_encode_refuses_oversized_frames() -> None:
    with pytest.raises(MessageTooLargeError):
        encode_frame(request(RequestCode.SEND, 1, {}, bytes(MAX_FRAME_BYTES)))
    with pytest.raises(MessageTooLargeError):
        encode_frame(request(RequestCode.SEND, 1, {"k": "x" * MAX_HEADER_BYTES}))
    with pytest.raises(MalformedRequestError):
        encode_frame(request(RequestCode.SEND, 2**32, {}))
    with pytest.raises(MalformedRequestError):
        encode_frame(request(RequestCode.SEND, 1, {"k": object()}))


def _header_of_size(size: int) -> bytes:
    """A valid header of exactly `size` bytes (padding in an `x` string)."""
    base = {"v": 1, "id": 1, "c": 10, "f": 0}
    for pad in range(size - 40, size):
        hb = msgpack.packb({**base, "x": {"p": "a" * pad}})
        if len(hb) == size:
            return hb
    raise AssertionError(size)


def test_header_limit_is_inclusive() -> None:
    hb = _header_of_size(MAX_HEADER_BYTES)
    (frame,) = FrameDecoder().feed(_raw(None, b"body", header_bytes=hb))
    assert frame.body == b"body" and len(frame.fields["p"]) > 60000
    assert len(encode_frame_parts(frame)[0]) == 8 + MAX_HEADER_BYTES
    too_big = _header_of_size(MAX_HEADER_BYTES + 1)
    with pytest.raises(MalformedFrameError, match="limit"):
        FrameDecoder().feed(_raw(None, header_bytes=too_big))
    frame.fields["p"] += "a"
    with pytest.raises(MessageTooLargeError):
        encode_frame(frame)


def test_body_views_point_into_immutable_chunks_and_handed_over_buffers() -> None:
    batch = [request(RequestCode.SEND, i, {"topic": "t"}, os.urandom(1000 * i + 1))
             for i in range(1, 40)]
    stream = b"".join(encode_frame(f) for f in batch)
    decoder = FrameDecoder(body_views=True)
    out: list[Frame] = []
    rnd = random.Random(7)
    pos = 0
    while pos < len(stream):
        step = rnd.randint(1, 30_000)
        out += decoder.feed(stream[pos:pos + step])
        pos += step
    assert out == batch
    assert all(isinstance(f.body, memoryview) and f.body.readonly for f in out)
    # Bodies from a reusable (mutable) chunk are still copies.
    recv = bytearray(encode_frame(batch[0]))
    (got,) = FrameDecoder(body_views=True).feed(recv)
    recv[:] = bytes(len(recv))
    assert got == batch[0] and isinstance(got.body, bytes)
