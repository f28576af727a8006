"""The entry encoder's compiled twin writes the same bytes as the pure encoder."""
from __future__ import annotations

import struct
from typing import Any

from ferry import extensions
from ferry.codec.entry import ENTRY_HEAD, ENTRY_HEAD_SIZE
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.twins import compiled_twin

PURE = "ferry.codec.entry"
entries = st.tuples(
    st.one_of(st.just(b""), st.binary(min_size=16, max_size=16)),  # msg_id
    st.integers(-(2**63), 2**63 - 1),  # born_ts_ms
    st.integers(0, 2**32 - 1) | st.just(2**32),  # flags (one that does not fit: struct.error)
    st.binary(max_size=40), st.binary(max_size=40), st.binary(max_size=80), st.binary(max_size=500),
)


def _outcome(fn: Any, *args: Any) -> tuple[Any, ...]:
    parts: list[bytes] = []
    try:
        fn(parts, *args)
    except Exception as exc:
        return (type(exc), str(exc))
    return (b"".join(parts),)


@settings(max_examples=200, deadline=None)
@given(entries)
def test_append_entry(e: tuple[Any, ...]) -> None:
    twin = compiled_twin(PURE).append_entry
    assert _outcome(twin, *e) == _outcome(extensions.pure(PURE, "append_entry"), *e)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.binary(max_size=300) | st.sampled_from([b"x" * 64, b""]), max_size=30),
       st.integers(-(2**63), 2**63 - 1))
def test_append_plain_entries(bodies: list[bytes], born_ts_ms: int) -> None:
    """Equal but for the ids, which each call draws anew (and appends, one an entry)."""
    runs = []
    for fn in (compiled_twin(PURE).append_plain_entries,
               extensions.pure(PURE, "append_plain_entries")):
        parts: list[bytes] = []
        ids: list[bytes] = []
        fn(parts, ids, iter(bodies), born_ts_ms)
        data, at, heads = b"".join(parts), 0, []
        for msg_id in ids:  # each entry's head but its id, and its body
            length, got_id, *rest = ENTRY_HEAD.unpack_from(data, at)
            assert got_id == msg_id
            heads.append((length, *rest, data[at + ENTRY_HEAD_SIZE:at + length]))
            at += length
        assert at == len(data) and len(ids) == len(bodies)
        runs.append(heads)
    assert runs[0] == runs[1]


def test_a_field_that_does_not_fit_is_refused_alike() -> None:
    e = (b"", 0, 0, b"", b"", b"", b"")
    bad = (b"", 2**63, 0, b"", b"", b"", b"")
    for args in (e, bad):
        twin = _outcome(compiled_twin(PURE).append_entry, *args)
        assert twin == _outcome(extensions.pure(PURE, "append_entry"), *args)
    assert _outcome(compiled_twin(PURE).append_entry, *bad)[0] is struct.error
