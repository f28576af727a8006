"""What a consumer takes of a topic (`Subscription`) and the broker's predicate over stored records.

`record_matcher` is on the broker's pull path: it reads one record as stored
(the `ferry.codec.record` layout) without decoding it. The tag check compares
the raw tag bytes; the SQL reads only the properties the selector needs for
this record (lazily: `a > 1 AND b = 'x'` never looks for `b` when `a` is 0),
found by searching the encoded properties (`key\\x01value\\x02` pairs, whose
keys and values never hold the separators, so `\\x02key\\x01` only matches at
a pair boundary).
"""
from __future__ import annotations

import struct
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from ferry.codec.properties import PROP_END, PROP_KV
from ferry.codec.record import HEADER_LAYOUT, HEADER_SIZE
from ferry.codec.tags import tag_hash
from ferry.errors import InvalidFilterError
from ferry.filter.compiler import compile_tree
from ferry.filter.evaluators import Evaluator, Fetch
from ferry.filter.sql import KEYS_NAME, MAX_CACHED_FILTERS, TAGS_NAME, Sql, SqlFilter, compile_sql
from ferry.filter.tags import parse_tags

RecordMatcher = Callable[[memoryview], bool]

_FIRST_LEN = [name for name, _ in HEADER_LAYOUT].index("topic_len")
_LAST_LEN = [name for name, _ in HEADER_LAYOUT].index("props_len")
#: topic_len, born_host_len, store_host_len, reserved, tags_len, keys_len, props_len:
#: the header fields that locate the tags, keys and properties, read in one unpack.
_PART_LENGTHS = struct.Struct("<" + "".join(c for _, c in HEADER_LAYOUT[_FIRST_LEN:_LAST_LEN + 1]))
_AT_PART_LENGTHS = struct.calcsize("<" + "".join(c for _, c in HEADER_LAYOUT[:_FIRST_LEN]))
_KV = PROP_KV.encode()
_END = PROP_END.encode()


@dataclass(frozen=True, slots=True)
class Subscription:
    """The tags (None = every tag) and the SQL selector (None = none) a consumer takes."""

    tags: frozenset[str] | None = None
    sql: SqlFilter | None = None

    @classmethod
    def from_fields(cls, tags_field: Any, sql_field: Any) -> Subscription:
        """From the PULL / HEARTBEAT fields `tags` (list or nil) and `sql` (str or nil).

        Raises InvalidFilterError for a selector that does not compile or fields of a wrong type.
        """
        if sql_field is not None and not isinstance(sql_field, str):
            raise InvalidFilterError(f"sql must be text or nil, not {type(sql_field).__name__}")
        if tags_field is not None and not isinstance(tags_field, (str, list, tuple)):
            raise InvalidFilterError(f"tags must be a list or nil, not {type(tags_field).__name__}")
        return cls(parse_tags(tags_field), None if sql_field is None else compile_sql(sql_field))

    @classmethod
    def of(cls, spec: str | Sql | Iterable[str] | None) -> Subscription:
        """From what a user passes: a tag expression ("a || b", "*"), an `Sql`, tags or None."""
        if isinstance(spec, Sql):
            return cls(None, compile_sql(spec.expression))
        return cls(parse_tags(spec), None)

    def to_fields(self) -> dict[str, list[str] | str | None]:
        """The wire fields: {"tags": sorted list or None, "sql": str or None}."""
        return {"tags": None if self.tags is None else sorted(self.tags),
                "sql": None if self.sql is None else self.sql.expression}

    @property
    def tag_hashes(self) -> frozenset[int] | None:
        """The tag hashes a consume-queue entry must carry to be read (None = any)."""
        return None if self.tags is None else frozenset(tag_hash(t) for t in self.tags)

    @property
    def is_all(self) -> bool:
        """True when it takes every message (no tag list, no selector)."""
        return self.tags is None and self.sql is None

    def matches(self, tags: str, props: Mapping[str, str], keys: str = "") -> bool:
        """Does a message with this tag string, these properties and keys pass?"""
        if self.tags is not None and tags not in self.tags:
            return False
        return self.sql is None or self.sql.evaluate(props, tags, keys)


def record_matcher(sub: Subscription) -> RecordMatcher | None:
    """A predicate over one stored record (a memoryview starting at the record), or None
    when `sub` takes every message. Never raises: a record it cannot read does not match."""
    if sub.is_all:
        return None
    tag_set = None if sub.tags is None else frozenset(t.encode() for t in sub.tags)
    if sub.sql is None:
        assert tag_set is not None
        return _tag_matcher(tag_set)
    return _sql_matcher(tag_set, sub.sql)


def _tag_matcher(tag_set: frozenset[bytes]) -> RecordMatcher:
    lengths = _PART_LENGTHS.unpack_from
    at = _AT_PART_LENGTHS
    tag_lengths = frozenset(len(t) for t in tag_set)

    def match_tags(record: memoryview) -> bool:
        try:
            topic_len, born_len, store_len, _, tags_len, _, _ = lengths(record, at)
            if tags_len not in tag_lengths:  # most misses end here, without a copy
                return False
            start = HEADER_SIZE + topic_len + born_len + store_len
            return record[start:start + tags_len].tobytes() in tag_set
        except Exception:  # noqa: BLE001 - on the broker's pull path: never raise
            return False
    return match_tags


def _sql_matcher(tag_set: frozenset[bytes] | None, sql: SqlFilter) -> RecordMatcher:
    lengths = _PART_LENGTHS.unpack_from
    at = _AT_PART_LENGTHS
    props_only = TAGS_NAME not in sql.names and KEYS_NAME not in sql.names
    evaluate = _record_evaluator(sql, props_only)

    def match_sql(record: memoryview) -> bool:
        try:
            topic_len, born_len, store_len, _, tags_len, keys_len, props_len = lengths(record, at)
            tags_at = HEADER_SIZE + topic_len + born_len + store_len
            keys_at = tags_at + tags_len
            if tag_set is not None and record[tags_at:keys_at].tobytes() not in tag_set:
                return False
            props_at = keys_at + keys_len
            # A leading separator makes every pair, the first included, read `\x02key\x01`.
            raw = _END + record[props_at:props_at + props_len].tobytes()
            if props_only:  # the usual selector: its context is the properties alone
                return evaluate(raw) is True
            return evaluate((raw, record, tags_at, keys_at, props_at)) is True
        except Exception:  # noqa: BLE001 - on the broker's pull path: never raise
            return False
    return match_sql


@lru_cache(maxsize=MAX_CACHED_FILTERS)
def _record_evaluator(sql: SqlFilter, props_only: bool) -> Evaluator:
    """`sql` compiled again with fetchers that read a stored record (see match_sql): its
    context is b"\\x02" + the properties when `props_only`, else the tuple
    (b"\\x02" + properties, record, tags_at, keys_at, props_at)."""
    return compile_tree(sql.tree, _props_fetch if props_only else _record_fetch).evaluate


def _record_fetch(name: str) -> Fetch:
    """A fetch over a full record context; an empty tag string or keys are NULL."""
    if name == TAGS_NAME:
        return lambda ctx: ctx[1][ctx[2]:ctx[3]].tobytes().decode("utf-8", "replace") or None
    if name == KEYS_NAME:
        return lambda ctx: ctx[1][ctx[3]:ctx[4]].tobytes().decode("utf-8", "replace") or None
    fetch = _props_fetch(name)
    return lambda ctx: fetch(ctx[0])


def _props_fetch(name: str) -> Fetch:
    """A fetch of one property from b"\\x02" + encoded properties; a value that is not
    UTF-8 cannot be compared with anything and reads as NULL."""
    pair = _END + name.encode() + _KV
    skip = len(pair)

    def fetch_property(raw: bytes) -> str | None:
        start = raw.find(pair)
        if start < 0:
            return None
        start += skip
        try:
            return raw[start:raw.find(_END, start)].decode()
        except UnicodeDecodeError:
            return None
    return fetch_property
