"""Property tests: whatever the text, compile_sql returns a filter or raises InvalidFilterError;
valid selectors evaluate without raising, on mappings and on stored records alike."""
from __future__ import annotations

from ferry.codec.properties import encode_properties
from ferry.codec.record import MessageIn, encode_record
from ferry.errors import InvalidFilterError
from ferry.filter import Subscription, compile_sql, record_matcher
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.filter.strategies import expressions, property_maps, token_soups

FUZZ = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _compile_or_refuse(text: str) -> None:
    try:
        f = compile_sql(text)
    except InvalidFilterError as err:
        assert str(err)
        if err.line:  # a position: inside the text, or just after its end
            lines = text.split("\n")
            assert 1 <= err.line <= len(lines)
            assert 1 <= err.column <= len(lines[err.line - 1]) + 1
        return
    assert f.evaluate({"a": "1", "b": "x"}, "t", "k") in (True, False)


@FUZZ
@given(st.text(max_size=200))
def test_random_text_compiles_or_is_refused(text: str) -> None:
    _compile_or_refuse(text)


@FUZZ
@given(token_soups)
def test_token_soups_compile_or_are_refused(text: str) -> None:
    _compile_or_refuse(text)


@FUZZ
@given(expressions, st.data())
def test_mutated_valid_expressions_compile_or_are_refused(expression: str,
                                                          data: st.DataObject) -> None:
    cut = data.draw(st.integers(0, len(expression)))
    junk = data.draw(st.sampled_from(["", "(", ")", "'", "AND", "NOT", ",", "IN", "@"]))
    _compile_or_refuse(expression[:cut] + junk + expression[cut:])


@FUZZ
@given(expressions, property_maps, st.sampled_from(["", "paid", "created"]),
       st.sampled_from(["", "k1 k2"]))
def test_valid_expressions_evaluate_alike_on_mappings_and_records(
        expression: str, props: dict[str, str], tags: str, keys: str) -> None:
    f = compile_sql(expression)
    expected = f.evaluate(props, tags, keys)
    assert expected in (True, False)
    # never both an expression and its negation
    assert not (expected and compile_sql(f"NOT ({expression})").evaluate(props, tags, keys))
    match = record_matcher(Subscription(sql=f))
    assert match is not None
    record = encode_record(
        MessageIn(topic="t", queue_id=0, body=b"body", tags=tags, keys=keys,
                  properties=encode_properties(props)),
        queue_offset=0, phy_offset=0, store_ts_ms=0)
    assert match(memoryview(record)) is expected


@FUZZ
@given(st.binary(max_size=300), st.sampled_from(["a = 'x'", "TAGS = 'paid' OR KEYS IS NULL",
                                                "a > 1 AND b IN ('x', NULL)"]))
def test_matchers_never_raise_on_random_bytes(raw: bytes, expression: str) -> None:
    for sub in (Subscription(sql=compile_sql(expression)),
                Subscription(frozenset({"paid"}), compile_sql(expression)),
                Subscription(frozenset({"paid", "x"}))):
        match = record_matcher(sub)
        assert match is not None
        assert match(memoryview(raw)) in (True, False)
