"""What a consumer takes of each topic: its `subscription=` argument, checked and compiled.

A subscription is a tag expression (`"created || paid"`, `"*"` for every
tag), an `Sql(...)` selector, or a dict `{topic: expression}` for several
topics (topics missing from the dict take every message). The shape is
checked when the Consumer is built (TypeError / ValueError); the expressions
themselves are compiled at `start()`, before any network call, so a bad one
raises InvalidFilterError with its line, column and what was expected. The
group's retry topic always takes everything: it holds only this group's nacks,
which passed the filter once already.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from ferry.filter import Sql, Subscription

#: What one topic's subscription may be given as (a list of tags is the older `tags=` form).
Spec = str | Sql | Iterable[str] | None


def subscription_specs(topics: Sequence[str], subscription: object,
                       tags: str | Iterable[str] | None) -> dict[str, Spec]:
    """Each topic's subscription as given; TypeError/ValueError for a wrong shape."""
    if subscription is not None and tags is not None:
        raise ValueError("give subscription= or tags= (the older name), not both")
    given = tags if subscription is None else subscription
    if isinstance(given, Mapping):
        unknown = sorted(str(t) for t in given if t not in topics)
        if unknown:
            raise ValueError(f"subscription names topics not subscribed to: {', '.join(unknown)}")
        for topic, spec in given.items():
            _check_spec(spec, f"the subscription of {topic}")
        return {t: given.get(t) for t in topics}
    _check_spec(given, "subscription")
    return {t: given for t in topics}  # type: ignore[misc]


def _check_spec(spec: object, what: str) -> None:
    if spec is None or isinstance(spec, str | Sql):
        return
    if isinstance(spec, Iterable) and not isinstance(spec, bytes | Mapping):
        return
    raise TypeError(f"{what} must be a tag expression (str), Sql(...) or a dict of them; "
                    f"got {type(spec).__name__}")


def compile_subscriptions(specs: Mapping[str, Spec]) -> dict[str, Subscription]:
    """The compiled filter of every topic that does not take everything.

    Raises InvalidFilterError (with the position) for an expression that does not parse.
    """
    out: dict[str, Subscription] = {}
    for topic, spec in specs.items():
        sub = Subscription.of(spec)
        if not sub.is_all:
            out[topic] = sub
    return out
