"""The staging loop's compiled twin stages the same bytes, index items and consume-queue
entries as the pure loop, and refuses the same input with the same error."""
from __future__ import annotations

from typing import Any

from ferry import extensions
from ferry.codec.entry import append_entry
from ferry.codec.message_flags import HOOKED_FLAGS
from ferry.codec.msg_id import NO_MSG_ID
from ferry.store.encode_context import EncodeContext, QueueRun, StageState
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.twins import compiled_twin

PURE = "ferry.store.batch_input"
entries = st.lists(st.tuples(
    st.binary(min_size=16, max_size=16).filter(lambda b: b != NO_MSG_ID),
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


@settings(max_examples=150, deadline=None)
@given(entries, st.sampled_from([4096, 1 << 20]), st.booleans(),
       st.sampled_from([0, 0, 0]) | st.integers(1, 300), st.sampled_from([1 << 62] * 4 + [1, 5]),
       st.sampled_from([0, 0, 0, 1, HOOKED_FLAGS]), st.sampled_from([0, 0, 0, 0, 3, 4]))
def test_the_twin_stages_what_the_pure_loop_stages(
        batch: list[tuple[Any, ...]], seg_bytes: int, exact_ids: bool, cut: int,
        max_count: int, refuse_flags: int, not_utf8: int) -> None:
    twin = compiled_twin(PURE).stage_batch_input
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
    assert _stage(twin, data, seg_bytes, **kw) == _stage(pure, data, seg_bytes, **kw)
