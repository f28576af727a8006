"""SQL92 selectors: the semantics table, three-valued logic, errors with their positions, limits."""
from __future__ import annotations

import itertools

import pytest
from ferry.errors import InvalidFilterError
from ferry.filter import MAX_NESTING_DEPTH, MAX_SQL_CHARS, Sql, SqlFilter, compile_sql

from tests.filter.cases import MESSAGES, SQL_TABLE


def _taken(expression: str) -> frozenset[str]:
    f = compile_sql(expression)
    return frozenset(name for name, (props, tags, keys) in MESSAGES.items()
                     if f.evaluate(props, tags, keys))


def test_the_table_is_large_enough() -> None:
    assert len(SQL_TABLE) >= 40


@pytest.mark.parametrize("expression, expected", sorted(SQL_TABLE.items()))
def test_selector_takes_exactly_the_matching_messages(expression: str,
                                                      expected: frozenset[str]) -> None:
    assert _taken(expression) == expected


def _truth(condition: str) -> str:
    """TRUE, FALSE or UNKNOWN, told apart by `evaluate` on the condition and on its NOT."""
    if compile_sql(condition).evaluate({"one": "1"}):
        return "TRUE"
    if compile_sql(f"NOT ({condition})").evaluate({"one": "1"}):
        return "FALSE"
    return "UNKNOWN"


#: A condition of each truth value, built from properties as a user would meet them.
CONDITIONS = {"TRUE": "one = 1", "FALSE": "one = 2", "UNKNOWN": "missing = 1"}
LITERALS = {"TRUE": "TRUE", "FALSE": "FALSE", "UNKNOWN": "NULL"}
AND_TABLE = {("TRUE", "TRUE"): "TRUE", ("TRUE", "FALSE"): "FALSE", ("TRUE", "UNKNOWN"): "UNKNOWN",
             ("FALSE", "FALSE"): "FALSE", ("FALSE", "UNKNOWN"): "FALSE",
             ("UNKNOWN", "UNKNOWN"): "UNKNOWN"}
OR_TABLE = {("TRUE", "TRUE"): "TRUE", ("TRUE", "FALSE"): "TRUE", ("TRUE", "UNKNOWN"): "TRUE",
            ("FALSE", "FALSE"): "FALSE", ("FALSE", "UNKNOWN"): "UNKNOWN",
            ("UNKNOWN", "UNKNOWN"): "UNKNOWN"}


@pytest.mark.parametrize("source", [CONDITIONS, LITERALS], ids=["properties", "literals"])
def test_not_and_or_follow_the_three_valued_truth_tables(source: dict[str, str]) -> None:
    assert {v: _truth(f"NOT ({c})") for v, c in source.items()} == {
        "TRUE": "FALSE", "FALSE": "TRUE", "UNKNOWN": "UNKNOWN"}
    for a, b in itertools.product(source, repeat=2):
        key = (a, b) if (a, b) in AND_TABLE else (b, a)
        assert _truth(f"({source[a]}) AND ({source[b]})") == AND_TABLE[key], (a, b)
        assert _truth(f"({source[a]}) OR ({source[b]})") == OR_TABLE[key], (a, b)
        # three operands take the n-ary path
        assert _truth(f"{source[a]} AND {source[b]} AND TRUE") == AND_TABLE[key], (a, b)
        assert _truth(f"{source[a]} OR {source[b]} OR FALSE") == OR_TABLE[key], (a, b)


def test_is_null_is_never_unknown() -> None:
    assert _truth("missing IS NULL") == "TRUE"
    assert _truth("missing IS NOT NULL") == "FALSE"
    assert _truth("NULL IS NULL") == "TRUE"
    assert _truth("1 IS NULL") == "FALSE"


def test_and_binds_tighter_than_or_and_not_tighter_than_and() -> None:
    assert _truth("one = 1 OR one = 2 AND one = 3") == "TRUE"
    assert _truth("(one = 1 OR one = 2) AND one = 3") == "FALSE"
    assert _truth("NOT one = 2 AND one = 1") == "TRUE"


@pytest.mark.parametrize("expression, line, column, expected_word", [
    ("a = ", 1, 5, "a number"),
    ("a == 1", 1, 4, "a property name"),
    ("a @ 1", 1, 3, "a comparison (= <> > >= < <=)"),
    ("amount > 100 AND", 1, 17, "a property name"),
    ("(a = 1", 1, 7, "')'"),
    ("a IN ()", 1, 7, "a 'string'"),
    ("a BETWEEN 1 OR 2", 1, 13, "AND"),
    ("a CONTAINS 5", 1, 12, "a 'string'"),
    ("a = 'unterminated", 1, 5, "a 'string'"),
    ("a = 1\nAND b >", 2, 8, "a number"),
    ("a = 1 b = 2", 1, 7, "AND"),
    ("and = 1", 1, 1, "a property name"),
])
def test_syntax_error_says_where_and_what_was_expected(expression: str, line: int, column: int,
                                                      expected_word: str) -> None:
    with pytest.raises(InvalidFilterError) as caught:
        compile_sql(expression)
    err = caught.value
    assert (err.line, err.column) == (line, column)
    assert expected_word in err.expected
    assert f"line {line}, column {column}" in str(err)
    assert expected_word in str(err)


@pytest.mark.parametrize("expression, column", [("5", 1), ("a = 1 OR 'x'", 10),
                                                ("NOT 2.5", 5)])
def test_a_number_or_string_is_not_a_condition(expression: str, column: int) -> None:
    with pytest.raises(InvalidFilterError, match="not a condition") as caught:
        compile_sql(expression)
    assert caught.value.column == column


@pytest.mark.parametrize("text", ["", "   ", "\n"])
def test_an_empty_selector_is_refused(text: str) -> None:
    with pytest.raises(InvalidFilterError, match="end of the expression"):
        compile_sql(text)


def test_limits_are_enforced_with_a_clear_error() -> None:
    fits = "a = 1" + " OR a = 1" * ((MAX_SQL_CHARS - 5) // 9)
    assert compile_sql(fits).evaluate({"a": "1"})
    with pytest.raises(InvalidFilterError, match=f"limit is {MAX_SQL_CHARS}"):
        compile_sql("a = 1" + " " * MAX_SQL_CHARS)
    assert compile_sql("NOT " * (MAX_NESTING_DEPTH - 1) + "a = 1")
    with pytest.raises(InvalidFilterError, match="nests deeper"):
        compile_sql("NOT " * MAX_NESTING_DEPTH + "a = 1")
    # parentheses alone add no depth; alternating AND / OR inside them do
    assert compile_sql("(" * 1000 + "a = 1" + ")" * 1000).evaluate({"a": "1"})
    deep = "a = 1"
    for level in range(MAX_NESTING_DEPTH):
        deep = f"(a = 1 {'AND' if level % 2 else 'OR'} {deep})"
    with pytest.raises(InvalidFilterError, match="nests deeper"):
        compile_sql(deep)


@pytest.mark.parametrize("text", [None, 5, b"a = 1", ["a = 1"]])
def test_non_text_is_refused(text: object) -> None:
    with pytest.raises(InvalidFilterError, match="must be text"):
        compile_sql(text)  # type: ignore[arg-type]


def test_compiled_once_and_cached_by_text() -> None:
    first = compile_sql("amount > 1")
    assert compile_sql("amount > 1") is first
    assert first == SqlFilter("amount > 1", (), first.tree, lambda ctx: None)
    assert hash(first) == hash("amount > 1")
    assert first.names == ("amount",)
    assert compile_sql("TAGS = 'a' AND x = y AND x > 1").names == ("TAGS", "x", "y")


def test_sql_is_a_plain_value_that_does_not_validate() -> None:
    bad = Sql("amount >")
    assert bad.expression == "amount >"
    assert Sql("a = 1") == Sql("a = 1")
    with pytest.raises(AttributeError):
        bad.expression = "x"  # type: ignore[misc]


def test_evaluate_never_raises_on_a_broken_mapping() -> None:
    class Broken(dict):
        def get(self, key, default=None):  # type: ignore[no-untyped-def, override]
            raise RuntimeError("boom")
    assert compile_sql("a = 1").evaluate(Broken()) is False


def test_huge_digit_strings_are_text_not_errors() -> None:
    f = compile_sql("n > 1")
    assert f.evaluate({"n": "9" * 10_000}) is False
    assert f.evaluate({"n": "9" * 4000}) is True
    assert compile_sql("n = '" + "9" * 4000 + "'").evaluate({"n": "9" * 4000})


def test_a_refused_selector_is_refused_again_alike() -> None:
    errors = []
    for _ in range(2):
        with pytest.raises(InvalidFilterError) as caught:
            compile_sql("amount > 100 AND @")
        errors.append(caught.value)
    first, again = errors
    assert first is not again
    assert (str(again), again.line, again.column, again.expected) == \
        (str(first), first.line, first.column, first.expected)
