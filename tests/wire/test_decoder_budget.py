"""FrameDecoder.pending_frame_bytes: what a server budgets for before a frame's bytes arrive."""
from __future__ import annotations

from ferry.wire import FrameDecoder, RequestCode, encode_frame, request


def test_pending_frame_bytes_is_the_announced_size_before_the_bytes_arrive() -> None:
    data = encode_frame(request(RequestCode.SEND, 1, {"topic": "t"}, b"x" * 100_000))
    decoder = FrameDecoder()
    assert decoder.pending_frame_bytes == 0
    decoder.feed(data[:3])
    assert decoder.pending_frame_bytes == 3  # not even the length yet: what is held
    decoder.feed(data[3:10])
    assert decoder.pending_frame_bytes == len(data)
    assert decoder.buffered_bytes == 10  # only what arrived is held
    assert len(decoder.feed(data[10:])) == 1 and decoder.pending_frame_bytes == 0
