"""Subscription filters: tag lists and SQL92 selectors, compiled once, applied by the broker.

See docs/filter.md for the grammar and the semantics (three-valued logic,
numbers against text, the limits).
"""
from __future__ import annotations

from ferry.filter.compiler import MAX_NESTING_DEPTH
from ferry.filter.sql import MAX_CACHED_FILTERS, MAX_SQL_CHARS, Sql, SqlFilter, compile_sql
from ferry.filter.subscription import RecordMatcher, Subscription, record_matcher
from ferry.filter.tags import MAX_SUBSCRIBED_TAGS, parse_tags

__all__ = [
    # selectors
    "Sql", "SqlFilter", "compile_sql",
    # subscriptions
    "Subscription", "parse_tags", "record_matcher", "RecordMatcher",
    # limits
    "MAX_SQL_CHARS", "MAX_NESTING_DEPTH", "MAX_CACHED_FILTERS", "MAX_SUBSCRIBED_TAGS",
]
