"""The tag hash: stable across processes, 0 for no tag, the same from str or UTF-8."""
from __future__ import annotations

from ferry.codec.tags import tag_bytes_hash, tag_hash
from hypothesis import given
from hypothesis import strategies as st


def test_stable_and_zero_means_no_tag() -> None:
    assert tag_hash("") == 0 == tag_bytes_hash(b"")
    assert tag_hash("created") == tag_hash("created") != tag_hash("paid")
    assert tag_hash("created") == 846844886  # CRC32C("created") + 1, fixed across processes


@given(st.text(min_size=1))
def test_str_and_utf8_agree_and_never_zero(tag: str) -> None:
    assert tag_hash(tag) == tag_bytes_hash(tag.encode()) > 0
