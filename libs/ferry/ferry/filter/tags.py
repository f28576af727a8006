"""Tag subscriptions: RocketMQ's `"created || paid"` syntax, `"*"` for every tag."""
from __future__ import annotations

from collections.abc import Iterable

from ferry.errors import InvalidFilterError

#: The subscription that takes every message whatever its tag.
ALL_TAGS = "*"
#: The separator between tags in a subscription expression.
TAG_SEPARATOR = "||"
#: Most tags one subscription may list.
MAX_SUBSCRIBED_TAGS = 256


def parse_tags(expression: str | Iterable[str] | None) -> frozenset[str] | None:
    """The tags a subscription takes; None means every tag ("*", "", None).

    Accepts the expression ("a || b") or the tags themselves (a list, as on
    the wire). Blank items are ignored; `*` anywhere means every tag. Raises
    InvalidFilterError for a non-text item or more than MAX_SUBSCRIBED_TAGS tags.
    """
    if expression is None:
        return None
    if isinstance(expression, str):
        items = expression.split(TAG_SEPARATOR)
    elif isinstance(expression, Iterable):
        items = list(expression)
    else:
        raise InvalidFilterError(f"a tag subscription must be text, not {type(expression).__name__}")
    tags = set()
    for item in items:
        if not isinstance(item, str):
            raise InvalidFilterError(f"a tag must be text, not {type(item).__name__}")
        tag = item.strip()
        if tag == ALL_TAGS:
            return None
        if tag:
            tags.add(tag)
    if len(tags) > MAX_SUBSCRIBED_TAGS:
        raise InvalidFilterError(f"a subscription lists {len(tags)} tags; the limit is "
                                 f"{MAX_SUBSCRIBED_TAGS}")
    return frozenset(tags) if tags else None
