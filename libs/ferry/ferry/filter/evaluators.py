"""The closures a compiled selector is made of: three-valued logic and comparisons.

An evaluator takes `v`, the values of the properties the selector names (in
the order of `Compiled.names`; None for a missing one) and returns True,
False or None (UNKNOWN: SQL's third truth value). Literals are folded into
each closure at compile time, so a message costs only the lookups and the
comparisons it needs. Nothing in a closure raises: every type mismatch is
UNKNOWN.
"""
from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Any

from ferry.filter.values import Value, as_bool, as_number, kind_of

Truth = bool | None
Evaluator = Callable[[Sequence[str | None]], Truth]

_OPS: dict[str, Callable[[Any, Any], bool]] = {
    "=": operator.eq, "<>": operator.ne, ">": operator.gt, ">=": operator.ge,
    "<": operator.lt, "<=": operator.le,
}
EQUALITY = frozenset(("=", "<>"))
#: The operator seen from the other side (`5 < a` is `a > 5`).
FLIPPED = {"=": "=", "<>": "<>", ">": "<", ">=": "<=", "<": ">", "<=": ">="}


def const(result: Truth) -> Evaluator:
    return lambda v: result


def not_(f: Evaluator) -> Evaluator:
    def negate(v: Sequence[str | None]) -> Truth:
        r = f(v)
        return None if r is None else not r
    return negate


def and_(fs: list[Evaluator]) -> Evaluator:
    if len(fs) == 2:
        a, b = fs

        def and2(v: Sequence[str | None]) -> Truth:
            x = a(v)
            if x is False:
                return False
            y = b(v)
            if y is False:
                return False
            return None if x is None or y is None else True
        return and2

    def and_n(v: Sequence[str | None]) -> Truth:
        unknown = False
        for f in fs:
            r = f(v)
            if r is False:
                return False
            if r is None:
                unknown = True
        return None if unknown else True
    return and_n


def or_(fs: list[Evaluator]) -> Evaluator:
    if len(fs) == 2:
        a, b = fs

        def or2(v: Sequence[str | None]) -> Truth:
            x = a(v)
            if x is True:
                return True
            y = b(v)
            if y is True:
                return True
            return None if x is None or y is None else False
        return or2

    def or_n(v: Sequence[str | None]) -> Truth:
        unknown = False
        for f in fs:
            r = f(v)
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


def property_vs_literal(op: str, i: int, c: Value) -> Evaluator:
    """`property op literal`, specialised on the literal's type (the hot case)."""
    if c is None:
        return const(None)
    fn = _OPS[op]
    if isinstance(c, bool):
        if op not in EQUALITY:
            return const(None)

        def prop_bool(v: Sequence[str | None]) -> Truth:
            s = v[i]
            b = None if s is None else as_bool(s)
            return None if b is None else fn(b, c)
        return prop_bool
    if isinstance(c, str):
        if op not in EQUALITY:
            return const(None)
        equal = op == "="

        def prop_str(v: Sequence[str | None]) -> Truth:
            s = v[i]
            return None if s is None else (s == c) is equal
        return prop_str

    def prop_num(v: Sequence[str | None]) -> Truth:
        s = v[i]
        if s is None:
            return None
        n = as_number(s)
        return None if n is None else fn(n, c)
    return prop_num


def property_in_strings(i: int, texts: frozenset[str], has_null: bool) -> Evaluator:
    """`property IN ('a', 'b', ...)`: one set lookup. A NULL in the list makes a miss UNKNOWN."""
    miss = None if has_null else False

    def in_strings(v: Sequence[str | None]) -> Truth:
        s = v[i]
        if s is None:
            return None
        return True if s in texts else miss
    return in_strings


def property_text_test(i: int, test: Callable[[str], bool]) -> Evaluator:
    """CONTAINS / STARTSWITH / ENDSWITH on a property: UNKNOWN when it is missing."""
    def text_test(v: Sequence[str | None]) -> Truth:
        s = v[i]
        return None if s is None else test(s)
    return text_test


def property_truth(i: int) -> Evaluator:
    """A property used as a condition on its own: 'true'/'false' (any case), else UNKNOWN."""
    def truth(v: Sequence[str | None]) -> Truth:
        s = v[i]
        return None if s is None else as_bool(s)
    return truth


def property_is_null(i: int, null: bool) -> Evaluator:
    """IS NULL (`null` True) or IS NOT NULL: never UNKNOWN."""
    if null:
        return lambda v: v[i] is None
    return lambda v: v[i] is not None


def properties_compare(op: str, i: int, j: int) -> Evaluator:
    """`property op property`."""
    return lambda v: compare_properties(op, v[i], v[j])
