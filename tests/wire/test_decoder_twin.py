"""The frame decoder's compiled twin returns the same frames as the pure decoder, for any
chunking, and fails on the same garbage with the same error."""
from __future__ import annotations

from typing import Any

import msgpack
from ferry import extensions
from ferry.wire import FRAME_PREFIX, Frame, encode_frame
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.twins import compiled_twin
from tests.wire.strategies import frames

PURE = "ferry.wire.decoder"
garbage_headers = st.one_of(
    st.binary(max_size=20),  # not msgpack
    st.sampled_from([[1, 2], {"v": 1}, {"v": 1, "id": 1, "c": 1, "f": 0, "x": {1: 2}},
                     {"v": 9, "id": 1, "c": 1, "f": 0}, {"v": 1, "id": -1, "c": 1, "f": 0},
                     {"v": 1, "id": 1, "c": 1, "f": 0, "e": "x"}]).map(msgpack.packb),
)


def _decode(decoder_class: Any, data: bytes, cuts: list[int], body_views: bool,
            max_frame_bytes: int) -> list[Any]:
    decoder = decoder_class(max_frame_bytes, body_views=body_views)
    out: list[Any] = []
    at = 0
    for cut in sorted(cuts) + [len(data)]:
        try:
            out += [(f.code, f.request_id, f.flags, f.error, f.message, f.fields,
                     bytes(f.body), f.version, f.auth) for f in decoder.feed(data[at:cut])]
        except Exception as exc:
            out.append((type(exc), str(exc)))
        at = max(at, cut)
        out.append((decoder.buffered_bytes, decoder.pending_frame_bytes))
    return out


@settings(max_examples=150, deadline=None)
@given(st.lists(frames, max_size=6), st.lists(st.integers(0, 8000), max_size=8), st.booleans(),
       st.sampled_from([1 << 20, 600]), garbage_headers | st.none())
def test_the_twin_decodes_what_the_pure_decoder_decodes(
        batch: list[Frame], cuts: list[int], body_views: bool, max_frame_bytes: int,
        garbage: bytes | None) -> None:
    data = b"".join(encode_frame(f) for f in batch)
    if garbage is not None:  # a frame whose header is not a valid one, at the end
        data += FRAME_PREFIX.pack(4 + len(garbage) + 3, len(garbage)) + garbage + b"abc"
    twin = compiled_twin(PURE).FrameDecoder
    pure = extensions.pure(PURE, "FrameDecoder")
    assert _decode(twin, data, cuts, body_views, max_frame_bytes) == \
        _decode(pure, data, cuts, body_views, max_frame_bytes)


@settings(max_examples=150, deadline=None)
@given(st.binary(max_size=64), st.lists(st.integers(0, 64), max_size=3))
def test_any_bytes(data: bytes, cuts: list[int]) -> None:
    twin = compiled_twin(PURE).FrameDecoder
    pure = extensions.pure(PURE, "FrameDecoder")
    assert _decode(twin, data, cuts, False, 1 << 20) == _decode(pure, data, cuts, False, 1 << 20)
