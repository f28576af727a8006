"""The closures a compiled selector is made of: three-valued logic and comparisons.

An evaluator takes a context (whatever its property fetchers understand: a
mapping of properties, or a stored record's encoded properties) and returns
True, False or None (UNKNOWN: SQL's third truth value). A property is read
by a `Fetch` closure, only when a comparison needs it, so `a > 1 AND b = 'x'`
never looks for `b` in a message whose `a` is 0. Literals are folded in at
compile time. Nothing here raises: every type mismatch is UNKNOWN.
"""
from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

from ferry.filter.values import Value, as_bool, as_number, kind_of

Truth = bool | None
Evaluator = Callable[[Any], Truth]
#: Reads one property (or TAGS / KEYS) from a context: its text, None when absent.
Fetch = Callable[[Any], "str | None"]

_OPS: dict[str, Callable[[Any, Any], bool]] = {
    "=": operator.eq, "<>": operator.ne, ">": operator.gt, ">=": operator.ge,
    "<": operator.lt, "<=": operator.le,
}
#: Longer digit strings go through as_number, which copes with int()'s digit limit.
_MAX_INLINE_DIGITS = 100
EQUALITY = frozenset(("=", "<>"))
#: The operator seen from the other side (`5 < a` is `a > 5`).
FLIPPED = {"=": "=", "<>": "<>", ">": "<", ">=": "<=", "<": ">", "<=": ">="}


def const(result: Truth) -> Evaluator:
    """An evaluator folded to one truth value at compile time."""
    return lambda ctx: result


def not_(f: Evaluator) -> Evaluator:
    """NOT: TRUE <-> FALSE; UNKNOWN stays UNKNOWN."""
    def negate(ctx: Any) -> Truth:
        r = f(ctx)
        return None if r is None else not r
    return negate


def and_(fs: list[Evaluator]) -> Evaluator:
    """AND: FALSE if any is FALSE, else UNKNOWN if any is UNKNOWN, else TRUE (left to right, lazily)."""
    if len(fs) == 2:
        a, b = fs

        def and2(ctx: Any) -> Truth:
            x = a(ctx)
            if x is False:
                return False
            y = b(ctx)
            if y is False:
                return False
            return None if x is None or y is None else True
        return and2

    def and_n(ctx: Any) -> Truth:
        unknown = False
        for f in fs:
            r = f(ctx)
            if r is False:
                return False
            if r is None:
                unknown = True
        return None if unknown else True
    return and_n


def or_(fs: list[Evaluator]) -> Evaluator:
    """OR: TRUE if any is TRUE, else UNKNOWN if any is UNKNOWN, else FALSE (left to right, lazily)."""
    if len(fs) == 2:
        a, b = fs

        def or2(ctx: Any) -> Truth:
            x = a(ctx)
            if x is True:
                return True
            y = b(ctx)
            if y is True:
                return True
            return None if x is None or y is None else False
        return or2

    def or_n(ctx: Any) -> Truth:
        unknown = False
        for f in fs:
            r = f(ctx)
            if r is True:
                return True
            if r is None:
                unknown = True
        return None if unknown else False
    return or_n


def compare_literals(op: str, a: Value, b: Value) -> Truth:
    """Compare two typed values: UNKNOWN when either is NULL, the types differ, or
    an order (< > ...) is asked of anything but numbers."""
    if a is None or b is None:
        return None
    kind = kind_of(a)
    if kind != kind_of(b) or (kind != "number" and op not in EQUALITY):
        return None
    return _OPS[op](a, b)


def compare_properties(op: str, a: str | None, b: str | None) -> Truth:
    """Compare two property texts: as numbers when both are numbers, else as text
    (= and <> only; an order between texts is UNKNOWN)."""
    if a is None or b is None:
        return None
    na, nb = as_number(a), as_number(b)
    if na is not None and nb is not None:
        return _OPS[op](na, nb)
    return _OPS[op](a, b) if op in EQUALITY else None


def property_vs_literal(op: str, fetch: Fetch, c: Value) -> Evaluator:
    """`property op literal`, specialised on the literal's type (the hot case)."""
    if c is None:
        return const(None)
    fn = _OPS[op]
    if isinstance(c, bool):
        if op not in EQUALITY:
            return const(None)

        def prop_bool(ctx: Any) -> Truth:
            s = fetch(ctx)
            b = None if s is None else as_bool(s)
            return None if b is None else fn(b, c)
        return prop_bool
    if isinstance(c, str):
        if op not in EQUALITY:
            return const(None)
        equal = op == "="

        def prop_str(ctx: Any) -> Truth:
            s = fetch(ctx)
            return None if s is None else (s == c) is equal
        return prop_str

    def prop_num(ctx: Any) -> Truth:
        s = fetch(ctx)
        if s is None:
            return None
        # The common case (a plain count or amount) inline: this runs per message at the broker.
        if s.isdigit() and s.isascii() and len(s) < _MAX_INLINE_DIGITS:
            return fn(int(s), c)
        n = as_number(s)
        return None if n is None else fn(n, c)
    return prop_num


def property_between(fetch: Fetch, low: int | float, high: int | float) -> Evaluator:
    """`property BETWEEN low AND high` with number bounds: one fetch, one parse."""
    def between(ctx: Any) -> Truth:
        s = fetch(ctx)
        if s is None:
            return None
        n = as_number(s)
        return None if n is None else low <= n <= high
    return between


def property_in_strings(fetch: Fetch, texts: frozenset[str], has_null: bool) -> Evaluator:
    """`property IN ('a', 'b', ...)`: one set lookup. A NULL in the list makes a miss UNKNOWN."""
    miss = None if has_null else False

    def in_strings(ctx: Any) -> Truth:
        s = fetch(ctx)
        if s is None:
            return None
        return True if s in texts else miss
    return in_strings


def property_text_test(fetch: Fetch, test: Callable[[str], bool]) -> Evaluator:
    """CONTAINS / STARTSWITH / ENDSWITH on a property: UNKNOWN when it is missing."""
    def text_test(ctx: Any) -> Truth:
        s = fetch(ctx)
        return None if s is None else test(s)
    return text_test


def property_truth(fetch: Fetch) -> Evaluator:
    """A property used as a condition on its own: 'true'/'false' (any case), else UNKNOWN."""
    def truth(ctx: Any) -> Truth:
        s = fetch(ctx)
        return None if s is None else as_bool(s)
    return truth


def property_is_null(fetch: Fetch, null: bool) -> Evaluator:
    """IS NULL (`null` True) or IS NOT NULL: never UNKNOWN."""
    if null:
        return lambda ctx: fetch(ctx) is None
    return lambda ctx: fetch(ctx) is not None


def properties_compare(op: str, left: Fetch, right: Fetch) -> Evaluator:
    """`property op property`."""
    return lambda ctx: compare_properties(op, left(ctx), right(ctx))
