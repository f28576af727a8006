"""The SEND entry: one declaration for the wire and the store, and its encoder."""
from __future__ import annotations

import struct

import ferry.wire as wire
import pytest
from ferry.codec import entry
from ferry.codec.entry import (
    ENTRY_HEAD,
    ENTRY_HEAD_FIELDS,
    ENTRY_HEAD_SIZE,
    ENTRY_PARTS,
    NO_MSG_ID,
    append_entry,
)
from ferry.codec.limits import MAX_KEYS_BYTES, MAX_PROPERTIES_BYTES, MAX_TAGS_BYTES
from hypothesis import given
from hypothesis import strategies as st

_entries = st.tuples(
    st.one_of(st.just(b""), st.binary(min_size=16, max_size=16)),  # msg_id
    st.integers(-(2**63), 2**63 - 1),  # born_ts_ms
    st.integers(0, 2**32 - 1),  # flags
    st.binary(max_size=40), st.binary(max_size=40), st.binary(max_size=80),
    st.binary(max_size=500),
)


def _read(data: bytes) -> list[dict[str, object]]:
    """Entries back to back, each as a dict of its head fields (by name) and parts."""
    out, at = [], 0
    while at < len(data):
        entry = dict(zip(ENTRY_HEAD_FIELDS, ENTRY_HEAD.unpack_from(data, at), strict=True))
        p = at + ENTRY_HEAD_SIZE
        for part, length in zip(ENTRY_PARTS, ("tags_len", "keys_len", "props_len", "body_len"),
                                strict=True):
            n = entry[length]
            assert isinstance(n, int)
            entry[part] = data[p:p + n]
            p += n
        assert p == at + entry["length"]
        out.append(entry)
        at = p
    return out


@given(st.lists(_entries, max_size=8))
def test_round_trip(entries: list[tuple]) -> None:
    parts: list[bytes] = []
    for e in entries:
        append_entry(parts, *e)
    got = _read(b"".join(parts))
    assert len(got) == len(entries)
    for g, (msg_id, born, flags, tags, keys, props, body) in zip(got, entries, strict=True):
        assert g["msg_id"] == (msg_id or NO_MSG_ID)
        assert (g["born_ts_ms"], g["flags"]) == (born, flags)
        assert (g["tags"], g["keys"], g["properties"], g["body"]) == (tags, keys, props, body)


def test_one_declaration_for_the_wire_and_the_store() -> None:
    assert wire.messages.ENTRY_HEAD is ENTRY_HEAD and ENTRY_HEAD_SIZE == 44
    assert ENTRY_HEAD.format == "<" + "".join(code for _, code in entry.ENTRY_LAYOUT)
    assert ENTRY_HEAD_FIELDS == tuple(name for name, _ in entry.ENTRY_LAYOUT)


def test_length_slots_hold_the_limits_and_no_more() -> None:
    fields = dict(zip(ENTRY_HEAD_FIELDS, ENTRY_HEAD.format.lstrip("<").replace("16s", "s"),
                      strict=True))
    assert (1 << 8 * struct.calcsize(fields["tags_len"])) - 1 == MAX_TAGS_BYTES
    assert (1 << 8 * struct.calcsize(fields["keys_len"])) - 1 == MAX_KEYS_BYTES
    assert MAX_PROPERTIES_BYTES <= (1 << 8 * struct.calcsize(fields["props_len"])) - 1
    with pytest.raises(struct.error):
        append_entry([], b"", 0, 0, b"t" * (MAX_TAGS_BYTES + 1), b"", b"", b"")
