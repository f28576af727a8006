"""Tag subscriptions, `Subscription` wire fields and `record_matcher` over real encoded records."""
from __future__ import annotations

import pytest
from ferry.codec.properties import encode_properties
from ferry.codec.record import MessageIn, encode_record
from ferry.codec.tags import tag_hash
from ferry.errors import InvalidFilterError
from ferry.filter import (
    MAX_SUBSCRIBED_TAGS,
    Sql,
    Subscription,
    compile_sql,
    parse_tags,
    record_matcher,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.filter.cases import MESSAGES, SQL_TABLE


def _record(props: dict[str, str], tags: str = "", keys: str = "", *,
            raw_props: bytes | None = None) -> memoryview:
    msg = MessageIn(topic="orders", queue_id=3, body=b"payload", tags=tags, keys=keys,
                    properties=encode_properties(props) if raw_props is None else raw_props,
                    born_host="10.0.0.1:5000")
    return memoryview(encode_record(msg, queue_offset=7, phy_offset=4096, store_ts_ms=1,
                                    store_host="10.0.0.2:9876"))


@pytest.mark.parametrize("expression, expected", [
    ("created || paid", frozenset({"created", "paid"})),
    ("  paid  ", frozenset({"paid"})),
    ("a||b||a", frozenset({"a", "b"})),
    ("a || || b", frozenset({"a", "b"})),
    ("*", None), ("", None), (None, None), ("a || *", None), (" || ", None),
    (["b", "a"], frozenset({"a", "b"})), ([], None), (("*",), None),
])
def test_parse_tags(expression: object, expected: frozenset[str] | None) -> None:
    assert parse_tags(expression) == expected  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [5, [1], ["a", None]])
def test_parse_tags_refuses_non_text(bad: object) -> None:
    with pytest.raises(InvalidFilterError):
        parse_tags(bad)  # type: ignore[arg-type]


def test_parse_tags_bounds_the_list() -> None:
    assert len(parse_tags([f"t{i}" for i in range(MAX_SUBSCRIBED_TAGS)]) or ()) == \
        MAX_SUBSCRIBED_TAGS
    with pytest.raises(InvalidFilterError, match="limit"):
        parse_tags(" || ".join(f"t{i}" for i in range(MAX_SUBSCRIBED_TAGS + 1)))


def test_subscription_wire_fields_round_trip() -> None:
    sub = Subscription.from_fields(["paid", "created"], "amount > 1")
    assert sub.to_fields() == {"tags": ["created", "paid"], "sql": "amount > 1"}
    assert Subscription.from_fields(**{"tags_field": None, "sql_field": None}).is_all
    assert Subscription.from_fields(*sub.to_fields().values()) == sub
    assert Subscription().to_fields() == {"tags": None, "sql": None}
    assert Subscription.from_fields(["*"], None).is_all
    assert not Subscription.from_fields(None, "TRUE").is_all


def test_tag_hashes_are_those_of_the_consume_queue() -> None:
    assert Subscription.of("a || b").tag_hashes == frozenset({tag_hash("a"), tag_hash("b")})
    assert Subscription.of("*").tag_hashes is None
    assert Subscription(sql=compile_sql("TRUE")).tag_hashes is None


def test_subscription_of_what_a_user_passes() -> None:
    assert Subscription.of("created || paid") == Subscription(frozenset({"created", "paid"}))
    assert Subscription.of("*").is_all and Subscription.of(None).is_all
    assert Subscription.of(Sql("a = 1")).sql == compile_sql("a = 1")
    with pytest.raises(InvalidFilterError) as caught:
        Subscription.of(Sql("a = "))
    assert caught.value.column == 5


@pytest.mark.parametrize("tags, sql", [(None, "amount >"), (5, None), (None, 7), ({}, None),
                                       (None, "")])
def test_bad_wire_fields_are_refused(tags: object, sql: object) -> None:
    with pytest.raises(InvalidFilterError):
        Subscription.from_fields(tags, sql)


def test_record_matcher_is_none_when_everything_is_taken() -> None:
    assert record_matcher(Subscription()) is None
    assert record_matcher(Subscription.of("*")) is None


def test_tag_matcher_compares_the_exact_tag() -> None:
    match = record_matcher(Subscription.of("paid || shipped"))
    assert match is not None
    taken = {tag: match(_record({}, tag)) for tag in
             ["paid", "shipped", "", "Paid", "paid2", "pai", "shipped ", "paiD", "créé"]}
    assert taken == {"paid": True, "shipped": True, "": False, "Paid": False, "paid2": False,
                     "pai": False, "shipped ": False, "paiD": False, "créé": False}
    unicode_match = record_matcher(Subscription.of("créé"))
    assert unicode_match is not None and unicode_match(_record({}, "créé"))


@pytest.mark.parametrize("expression, expected", sorted(SQL_TABLE.items()))
def test_sql_matcher_on_records_agrees_with_the_table(expression: str,
                                                     expected: frozenset[str]) -> None:
    match = record_matcher(Subscription(sql=compile_sql(expression)))
    assert match is not None
    taken = {name for name, (props, tags, keys) in MESSAGES.items()
             if match(_record(props, tags, keys))}
    assert taken == expected


def test_tags_and_sql_both_apply() -> None:
    match = record_matcher(Subscription(frozenset({"paid"}), compile_sql("amount > 100")))
    assert match is not None
    assert match(_record({"amount": "150"}, "paid"))
    assert not match(_record({"amount": "150"}, "created"))
    assert not match(_record({"amount": "50"}, "paid"))


def test_a_property_name_inside_another_is_not_taken_for_it() -> None:
    match = record_matcher(Subscription(sql=compile_sql("id = '1'")))
    assert match is not None
    assert not match(_record({"xid": "1", "idx": "1"}))
    assert not match(_record({"a": "id", "b": "id\x03"}))  # the name as a value is no key
    assert match(_record({"xid": "2", "id": "1"}))
    assert match(_record({"id": "1", "xid": "2"}))


def test_matcher_never_raises_on_bad_records() -> None:
    match = record_matcher(Subscription(frozenset({"paid"}), compile_sql("a = 'x' OR TAGS = 'paid'")))
    assert match is not None
    good = _record({"a": "x"}, "paid")
    assert match(good)
    assert not match(good[:50])         # truncated header
    assert not match(memoryview(b""))
    assert match(good[:-30]) in (True, False)  # parts past the end: read short, no error
    # a value that is not UTF-8 reads as NULL; the rest of the selector still decides
    not_utf8 = _record({}, "paid", raw_props=b"a\x01\xff\xfe\x02")
    assert match(not_utf8) is True
    match_a = record_matcher(Subscription(sql=compile_sql("a IS NULL")))
    assert match_a is not None and match_a(not_utf8) is True
    unterminated = _record({}, "", raw_props=b"a\x01x")
    assert match_a(unterminated) in (True, False)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.text(st.characters(blacklist_categories=("Cs",),
                                             blacklist_characters="\x01\x02"), min_size=1,
                               max_size=5),
                       st.text(st.characters(blacklist_categories=("Cs",),
                                             blacklist_characters="\x01\x02"), max_size=5),
                       max_size=5),
       st.sampled_from(["a", "amount", "x.y", "$k"]))
def test_matcher_reads_each_property_as_decode_does(props: dict[str, str], name: str) -> None:
    match = record_matcher(Subscription(sql=compile_sql(f"{name} IS NULL")))
    assert match is not None
    assert match(_record(props)) is (name not in props)
    if name in props:
        value = props[name].replace("'", "''")
        equal = record_matcher(Subscription(sql=compile_sql(f"{name} = '{value}'")))
        assert equal is not None and equal(_record(props))
