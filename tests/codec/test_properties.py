"""The properties codec: any map of valid names and values round-trips; garbage is refused."""
from __future__ import annotations

import pytest
from ferry.codec.properties import PROP_END, PROP_KV, decode_properties, encode_properties
from ferry.errors import CorruptRecordError
from hypothesis import given
from hypothesis import strategies as st

_text = st.text(alphabet=st.characters(codec="utf-8", exclude_characters=PROP_KV + PROP_END),
                max_size=30)
_props = st.dictionaries(_text.filter(bool), _text, max_size=8)


@given(_props)
def test_round_trip(props: dict[str, str]) -> None:
    raw = encode_properties(props)
    assert decode_properties(raw) == props
    assert decode_properties(memoryview(raw)) == props
    assert (raw == b"") == (not props)


@given(_props, _props)
def test_concatenated_maps_decode_as_one(a: dict[str, str], b: dict[str, str]) -> None:
    """Pairs are self-delimiting: appending a map's bytes adds (or overrides) its pairs."""
    assert decode_properties(encode_properties(a) + encode_properties(b)) == {**a, **b}


@given(st.binary(max_size=64))
def test_any_bytes_decode_or_raise_corrupt_record(raw: bytes) -> None:
    try:
        got = decode_properties(raw)
    except CorruptRecordError:
        return
    assert decode_properties(encode_properties(got)) == got


def test_separators_and_garbage_are_refused() -> None:
    with pytest.raises(ValueError):
        encode_properties({"a\x01": "b"})
    with pytest.raises(ValueError):
        encode_properties({"": "b"})
    with pytest.raises(ValueError):
        encode_properties({"a": "b\x02"})
    for raw in (b"novalue\x02", b"a\x01b", b"\xff\x01b\x02", b"\x01b\x02"):
        with pytest.raises(CorruptRecordError):
            decode_properties(raw)
