"""The staging loop's twins (mypyc's, compiled from the pure source, and the native one,
hand-written in Cython) stage the same bytes, index items and consume-queue entries as
the pure loop, and refuse the same input with the same error."""
from __future__ import annotations

from typing import Any

import pytest
from ferry import extensions
from ferry.codec.entry import append_entry
from ferry.codec.message_flags import HOOKED_FLAGS
from ferry.codec.msg_id import NO_MSG_ID
from ferry.store.encode_context import EncodeContext, QueueRun, StageState
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.twins import compiled_twin, native_twin

PURE = "ferry.store.batch_input"
# Ids as producers make them (one prefix, a counter: consecutive ids share an index-key
# run) and random ones.
msg_ids = (st.binary(min_size=16, max_size=16).filter(lambda b: b != NO_MSG_ID)
           | st.integers(1, 47).map(lambda i: b"\x07" * 15 + bytes([i])))
entries = st.lists(st.tuples(
    msg_ids,
    st.integers(min_value=-(2**63), max_value=2**63 - 1),  # born_ts_ms
    st.sampled_from([0, 1, 2, HOOKED_FLAGS, 2**32 - 1]),  # flags
    st.text(max_size=6).map(str.encode),  # tags
    st.lists(st.sampled_from([b"", b"k1", b"order-7", b"\xc3\xa9"]), max_size=3).map(b" ".join),
    st.binary(max_size=40),  # properties
    st.binary(max_size=300),  # body
), min_size=1, max_size=24)


def _stage(stage: Any, data: bytes, seg_bytes: int, **kw: Any) -> tuple[Any, ...]:
    ctx = EncodeContext(256, "10.0.0.9:10911", seg_bytes)
    state = StageState.__new__(StageState)
    state.pos, state.seg_start, state.rel = 0, 0, seg_bytes - 600
    state.seals, state.items, state.queues = [], [], {}
    q = QueueRun(3, 41, b"orders", 12345)
    try:
        count = stage(ctx, state, q, (b"10.1.2.3:4567", 13), data, 1_700_000_000_123, **kw)
    except Exception as exc:  # the same refusal, word for word
        return (type(exc), str(exc))
    return (count, bytes(ctx.buf[:state.pos]), state.seals, state.items, q.entries,
            q.next_offset, state.seg_start, state.rel)


TWINS = {"mypyc": compiled_twin, "native": native_twin}


@pytest.mark.parametrize("kind", sorted(TWINS))
@settings(max_examples=150, deadline=None)
@given(entries, st.sampled_from([4096, 1 << 20]), st.booleans(),
       st.sampled_from([0, 0, 0]) | st.integers(1, 300), st.sampled_from([1 << 62] * 4 + [1, 5]),
       st.sampled_from([0, 0, 0, 1, HOOKED_FLAGS]), st.sampled_from([0, 0, 0, 0, 3, 4]),
       st.booleans())
def test_the_twin_stages_what_the_pure_loop_stages(
        kind: str, batch: list[tuple[Any, ...]], seg_bytes: int, exact_ids: bool, cut: int,
        max_count: int, refuse_flags: int, not_utf8: int, view: bool) -> None:
    twin = TWINS[kind](PURE).stage_batch_input
    pure = extensions.pure(PURE, "stage_batch_input")
    parts: list[bytes] = []
    if not_utf8:  # the last entry's tags (3) or keys (4) are not UTF-8
        batch[-1] = batch[-1][:not_utf8] + (b"\xff",) + batch[-1][not_utf8 + 1:]
    for msg_id, born, flags, tags, keys, props, body in batch:
        append_entry(parts, msg_id, born, flags, tags, keys, props, body)
    data = b"".join(parts)
    if cut:  # truncated or misframed input, and bodies over the limit (256) above
        data = data[:-cut] if cut % 2 else data[:cut] + bytes(4) + data[cut + 4:]
    kw = dict(max_count=max_count, refuse_flags=refuse_flags, exact_ids=exact_ids,
              reconsume_times=2, prepared_offset=77)
    given_data: Any = data
    if view:   # as the broker hands a SEND body over: a view into its receive buffer
        given_data = memoryview(b"<" + data + b">")[1:-1]
    assert _stage(twin, given_data, seg_bytes, **kw) == _stage(pure, data, seg_bytes, **kw)


@pytest.mark.parametrize("kind", sorted(TWINS))
@pytest.mark.parametrize("exact_ids", [False, True])
def test_the_twin_keys_id_runs_as_the_pure_loop(kind: str, exact_ids: bool) -> None:
    """A producer's ids run in order: 40 of them share index-key runs of up to 16
    records (a segment roll ends one), as the pure loop keys them; so do 20 records
    of one id (a message sent again), where only the count ends a run."""
    twin = TWINS[kind](PURE).stage_batch_input
    pure = extensions.pure(PURE, "stage_batch_input")
    parts: list[bytes] = []
    ids = [(1000 + i).to_bytes(8, "big") for i in range(40)] + [bytes(7) + b"\x09"] * 20
    for i, low in enumerate(ids):
        append_entry(parts, b"\x05" * 8 + low, i, 0, b"", b"", b"", bytes(64))
    data = b"".join(parts)
    got = _stage(twin, data, 4096, exact_ids=exact_ids)
    assert got == _stage(pure, data, 4096, exact_ids=exact_ids)
    assert got[0] == 60 and got[2]   # all staged, across a segment roll


@pytest.mark.parametrize("change, kw", [
    ("bytearray", {}),                                  # data not bytes, read in place
    ("strided", {}),                                    # a view that is not flat
    ("words", {}),                                      # a view of 4-byte items
    ("", {"prepared_offset": 2**63}),                   # past the header's i64
    ("", {"reconsume_times": -(2**31) - 1}),            # past its i32
    ("", {"max_count": 2**70}),
    ("", {"ts": 2**64}),
])
def test_the_native_twin_leaves_what_its_c_types_do_not_hold_to_the_pure_loop(
        change: str, kw: dict[str, Any]) -> None:
    """Out of the fast path's C integer ranges, or no flat byte buffer: the native twin
    runs the pure loop, so it stages or refuses exactly as the pure loop does
    (struct.error); a bytearray it reads in place, staging what the pure loop stages."""
    native = native_twin(PURE).stage_batch_input
    pure = extensions.pure(PURE, "stage_batch_input")
    parts: list[bytes] = []
    for i in range(3):
        append_entry(parts, bytes([i + 1]) * 16, 5, 0, b"t", b"k a", b"", b"body %d" % i)
    data: Any = b"".join(parts)
    if change == "bytearray":
        data = bytearray(data)
    elif change == "strided":
        data = memoryview(data + data)[::2]
    elif change == "words":
        data = memoryview(data + bytes(-len(data) % 4)).cast("I")
    ts = kw.pop("ts", 1_700_000_000_123)

    def stage(fn: Any) -> tuple[Any, ...]:
        ctx = EncodeContext(256, "10.0.0.9:10911", 1 << 20)
        state = StageState.__new__(StageState)
        state.pos, state.seg_start, state.rel = 0, 0, 0
        state.seals, state.items, state.queues = [], [], {}
        q = QueueRun(3, 41, b"orders", 12345)
        try:
            count = fn(ctx, state, q, (b"10.1.2.3:4567", 13), data, ts, **kw)
        except Exception as exc:
            return (type(exc), str(exc))
        return (count, bytes(ctx.buf[:state.pos]), state.items, q.entries)

    got = stage(native)
    assert got == stage(pure)
    # the pure loop's own outcome: a huge max_count stages all; the rest are refused
    assert (got[0] == 3) is ("max_count" in kw or change == "bytearray")
