"""Hypothesis strategies for selectors: valid expressions, token soups, property maps."""
from __future__ import annotations

from hypothesis import strategies as st

NAMES = ["a", "b", "amount", "region", "x.y", "TAGS", "KEYS"]
#: Property values: numbers, near-numbers, booleans, text with quotes and unicode.
VALUES = st.one_of(
    st.integers(-10**6, 10**6).map(str),
    st.decimals(-1000, 1000, places=3, allow_nan=False).map(str),
    st.sampled_from(["", " 1", "1e3", "true", "FALSE", "abc", "O'Brien", "eu", "1.", "-", "+5"]),
    st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x01\x02"),
            max_size=8),
)


def _string_literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


literals = st.one_of(
    st.integers(-10**9, 10**9).map(str),
    st.decimals(-1000, 1000, places=2, allow_nan=False, allow_infinity=False).map(
        lambda d: format(d, "f")),
    st.text(max_size=6).map(_string_literal),
    st.sampled_from(["TRUE", "FALSE", "NULL", "true", "null"]),
)
operands = st.one_of(st.sampled_from(NAMES), literals)
string_literals = st.text(max_size=4).map(_string_literal)


@st.composite
def predicates(draw: st.DrawFn) -> str:
    left = draw(operands)
    kind = draw(st.integers(0, 7))
    if kind == 0:
        return f"{left} {draw(st.sampled_from(['=', '<>', '>', '>=', '<', '<=']))} {draw(operands)}"
    if kind == 1:
        neg = draw(st.sampled_from(["", "NOT "]))
        return f"{left} {neg}BETWEEN {draw(operands)} AND {draw(operands)}"
    if kind == 2:
        neg = draw(st.sampled_from(["", "NOT "]))
        items = draw(st.lists(literals, min_size=1, max_size=4))
        return f"{left} {neg}IN ({', '.join(items)})"
    if kind == 3:
        return f"{left} IS {draw(st.sampled_from(['', 'NOT ']))}NULL"
    if kind == 4:
        op = draw(st.sampled_from(["CONTAINS", "NOT CONTAINS", "STARTSWITH", "NOT STARTSWITH",
                                   "ENDSWITH", "NOT ENDSWITH"]))
        return f"{left} {op} {draw(string_literals)}"
    if kind == 5:
        return draw(st.sampled_from(["TRUE", "FALSE", "NULL", "a", "b"]))
    return f"{draw(st.sampled_from(NAMES))} = {draw(literals)}"


def _combine(children: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    return st.one_of(
        children.map(lambda e: f"NOT ({e})"),
        children.map(lambda e: f"NOT {e}"),
        st.tuples(children, children).map(lambda p: f"({p[0]}) AND ({p[1]})"),
        st.tuples(children, children).map(lambda p: f"{p[0]} OR {p[1]}"),
        st.tuples(children, children, children).map(lambda p: f"({p[0]} AND {p[1]} OR {p[2]})"),
    )


#: Valid selectors; deep enough to exercise nesting, bounded well below MAX_NESTING_DEPTH.
expressions = st.recursive(predicates(), _combine, max_leaves=12)

#: Property maps with names the expressions use (and some they do not).
property_maps = st.dictionaries(
    st.sampled_from(["a", "b", "amount", "region", "x.y", "other"]), VALUES, max_size=6)

TOKENS = ["a", "b", "TAGS", "1", "-2", "3.5", "'x'", "''''", "=", "<>", "<", ">=", "AND", "OR",
          "NOT", "BETWEEN", "IN", "IS", "NULL", "TRUE", "CONTAINS", "STARTSWITH", "ENDSWITH",
          "(", ")", ",", "'", "@", "\n", "--", "\\", "é", "\x00", "1.", "..", "$a"]
token_soups = st.lists(st.sampled_from(TOKENS), max_size=30).map(" ".join)
