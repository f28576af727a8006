"""The broker's compiled-filter cache: wire fields checked, compiled once, bounded."""
from __future__ import annotations

import pytest
from ferry.errors import InvalidFilterError, MalformedRequestError
from ferry.store import tag_hash
from ferry_broker.filters import MAX_TAGS, FilterCache


def test_fields_become_tag_hashes_and_a_matcher() -> None:
    cache = FilterCache()
    for tags in (None, "*", ["a", "*"], [], ""):
        every = cache.get(tags, None)
        assert every.tag_hashes is None and every.match is None
    tags = cache.get(["a", "b"], None)
    assert tags.tag_hashes == {tag_hash("a"), tag_hash("b")} and tags.match is not None
    assert cache.get("a || b", None).tag_hashes == tags.tag_hashes
    both = cache.get(["a"], "x > 1")
    assert both.tag_hashes == {tag_hash("a")} and both.match is not None
    sql = cache.get(None, "x > 1")
    assert sql.tag_hashes is None and sql.match is not None
    assert cache.get(None, "x > 1") is sql  # compiled once


def test_the_cache_is_bounded_and_keeps_recent_filters() -> None:
    cache = FilterCache(max_entries=3)
    first = cache.get(None, "x = 0")
    for i in range(1, 3):
        cache.get(None, f"x = {i}")
    assert cache.get(None, "x = 0") is first  # now the most recent
    cache.get(None, "x = 3")  # drops "x = 1", the least recently used
    assert len(cache) == 3 and cache.get(None, "x = 0") is first


def test_bad_fields_are_refused_and_not_cached() -> None:
    cache = FilterCache()
    with pytest.raises(InvalidFilterError):
        cache.get(None, "x >")
    for tags, sql in ((17, None), ([1], None), (["a"] * (MAX_TAGS + 1), None), (None, 5),
                      (None, ["x = 1"]), ({"a": 1}, None)):
        with pytest.raises((MalformedRequestError, InvalidFilterError)):
            cache.get(tags, sql)
    assert len(cache) == 0
