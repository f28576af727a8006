"""Subscriptions as the broker applies them: wire fields -> a compiled, cached filter.

A PULL (and a HEARTBEAT) names what a consumer takes of a topic with `tags`
(a list of tags, a `"a||b"` string, `"*"` or nil) and `sql` (a SQL92 selector
or nil). The broker turns them into a `ferry.filter.Subscription` and from it
into what the store needs: the tag hashes for the consume-queue scan (cheap,
before the commit log is read) and `record_matcher`, the exact check on the
record itself (the tag string, so that two tags sharing a hash never leak, and
the SQL on its properties, TAGS and KEYS).

Compiling costs a parse; consumers send the same few filters with every pull,
so compiled filters are kept in a bounded LRU keyed by the fields as sent.
A filter that does not compile is not cached here: `InvalidFilterError` each
time (`compile_sql` refuses an over-long one, MAX_SQL_CHARS, before parsing,
and remembers the refusal of a repeated one).

Each cached filter counts the PULLs that carried it (`pulled`), shown in
`/v1/stats` under `filters`: an operator (and a test) sees which filters
readers send, a Spark read's `filter` among them.
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ferry.codec.limits import MAX_TAGS_BYTES
from ferry.errors import MalformedRequestError
from ferry.filter import MAX_SUBSCRIBED_TAGS, Subscription, record_matcher

#: Tags in one subscription (a PULL's `tags`, a HEARTBEAT subscription's): ferry.filter's.
MAX_TAGS = MAX_SUBSCRIBED_TAGS
#: Characters of one tag: no stored tag is longer (the record's tags_len is a u16 of bytes).
MAX_TAG_CHARS = MAX_TAGS_BYTES
#: Compiled (tags, sql) filters kept by a broker.
MAX_CACHED_FILTERS = 1024

#: The cache key: (tags as sent, as a tuple or a string or None; sql as sent).
FilterKey = tuple[tuple[str, ...] | str | None, str | None]


@dataclass(frozen=True, slots=True)
class CompiledFilter:
    """One subscription, ready for the store."""

    subscription: Subscription
    tag_hashes: frozenset[int] | None  # None: no consume-queue filter
    match: Callable[[memoryview], bool] | None  # None: every record the hashes let through


def filter_key(tags: Any, sql: Any) -> FilterKey:
    """The fields checked for type and size, as a hashable key (MalformedRequestError).

    A tag string ("a || b") or a selector is bounded by the frame header (64 KiB);
    `compile_sql` refuses a selector over MAX_SQL_CHARS before parsing it.
    """
    if isinstance(tags, list):
        if len(tags) > MAX_TAGS or not all(type(t) is str and len(t) <= MAX_TAG_CHARS
                                           for t in tags):
            raise MalformedRequestError(f"field 'tags' must be a list of at most {MAX_TAGS} "
                                        f"tags of at most {MAX_TAG_CHARS} characters")
        tags = tuple(tags)
    elif tags is not None and type(tags) is not str:
        raise MalformedRequestError(f"field 'tags' must be a list of strings, a string or "
                                    f"null, not {type(tags).__name__}")
    if sql is not None and type(sql) is not str:
        raise MalformedRequestError(f"field 'sql' must be a string or null, not "
                                    f"{type(sql).__name__}")
    return tags, sql


def compile_filter(key: FilterKey) -> CompiledFilter:
    """Build the filter of `key` (InvalidFilterError for a bad sql or tag expression)."""
    tags, sql = key
    tags_field = list(tags) if isinstance(tags, tuple) else tags
    sub = Subscription.from_fields(tags_field, sql)
    return CompiledFilter(sub, sub.tag_hashes, record_matcher(sub))


class FilterCache:
    """Compiled filters by (tags, sql) as sent, least recently used dropped first."""

    def __init__(self, max_entries: int = MAX_CACHED_FILTERS) -> None:
        self._max_entries = max_entries
        self._cache: OrderedDict[FilterKey, CompiledFilter] = OrderedDict()
        self._pulls: dict[FilterKey, int] = {}   # PULLs per cached filter (not take-all)

    def __len__(self) -> int:
        return len(self._cache)

    def get(self, tags: Any, sql: Any) -> CompiledFilter:
        """The compiled filter of these wire fields (MalformedRequestError,
        InvalidFilterError for bad ones, which are never cached)."""
        key = filter_key(tags, sql)
        got = self._cache.get(key)
        if got is not None:
            self._cache.move_to_end(key)
            return got
        got = compile_filter(key)
        self._cache[key] = got
        if len(self._cache) > self._max_entries:
            self._pulls.pop(self._cache.popitem(last=False)[0], None)
        return got

    def pulled(self, tags: Any, sql: Any) -> None:
        """Count a PULL that filtered with these (valid, cached) fields."""
        key = filter_key(tags, sql)
        self._pulls[key] = self._pulls.get(key, 0) + 1

    def as_json(self) -> list[dict[str, Any]]:
        """The `filters` section of /v1/stats: each cached filter PULLs used, and how often."""
        out = []
        for (tags, sql), pulls in sorted(self._pulls.items(), key=lambda kv: -kv[1]):
            tag_list = sorted(tags) if isinstance(tags, tuple) else tags
            out.append({"tags": tag_list, "sql": sql, "pulls": pulls})
        return out
