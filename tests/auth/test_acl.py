"""Acl: resources, wildcards, deny beats allow, default deny, internal names, rule parsing."""
from __future__ import annotations

import pytest
from ferry.auth.acl import Acl, Rule, admin_rules, parse_rules
from ferry.errors import AccessDeniedError, MalformedRequestError


def rule(effect: str, resource: str, *actions: str) -> Rule:
    return Rule.parse({"effect": effect, "resource": resource, "actions": list(actions)})


def test_default_deny_and_allow_by_glob() -> None:
    acl = Acl({"p": [rule("allow", "topic:orders-*", "pub")]})
    assert acl.allows("p", "pub", "topic:orders-eu")
    assert not acl.allows("p", "pub", "topic:payments")
    assert not acl.allows("p", "sub", "topic:orders-eu")
    assert not acl.allows("p", "consume", "group:orders-eu")
    assert not acl.allows("p", "topics", "admin")
    assert not acl.allows("nobody", "pub", "topic:orders-eu")


def test_deny_beats_allow_whatever_the_order() -> None:
    for rules in ([rule("allow", "topic:*", "*"), rule("deny", "topic:secret", "sub")],
                  [rule("deny", "topic:secret", "sub"), rule("allow", "topic:*", "*")]):
        acl = Acl({"u": rules})
        assert acl.allows("u", "sub", "topic:orders")
        assert acl.allows("u", "pub", "topic:secret")
        assert not acl.allows("u", "sub", "topic:secret")


def test_plain_globs_never_match_internal_names() -> None:
    acl = Acl({"u": [rule("allow", "topic:*", "*")],
               "svc": [rule("allow", "topic:%SCHEDULE%", "sub")]})
    assert not acl.allows("u", "sub", "topic:%SCHEDULE%")
    assert acl.allows("svc", "sub", "topic:%SCHEDULE%")
    admin = Acl({"root": admin_rules()})
    assert admin.allows("root", "sub", "topic:%HALF%")
    assert admin.allows("root", "users", "admin")
    assert admin.allows("root", "reset", "group:g")


def test_check_names_action_and_resource_and_changes_clear_the_cache() -> None:
    acl = Acl()
    with pytest.raises(AccessDeniedError, match="'u' may not 'pub' on 'topic:t'"):
        acl.check("u", "pub", "topic:t")
    acl.set_rules("u", [rule("allow", "topic:t", "pub")])
    acl.check("u", "pub", "topic:t")
    acl.remove("u")
    assert not acl.allows("u", "pub", "topic:t")


@pytest.mark.parametrize("raw", [
    {"effect": "maybe", "resource": "topic:t", "actions": ["pub"]},
    {"effect": "allow", "resource": "queue:t", "actions": ["pub"]},
    {"effect": "allow", "resource": "topic:t", "actions": ["consume"]},
    {"effect": "allow", "resource": "admin", "actions": ["pub"]},
    {"effect": "allow", "resource": "admin:x", "actions": ["read"]},
    {"effect": "allow", "resource": "topic:a b", "actions": ["pub"]},
    {"effect": "allow", "resource": "topic:t", "actions": []},
    "allow topic:t pub",
])
def test_bad_rules_are_refused(raw: object) -> None:
    with pytest.raises(MalformedRequestError):
        Rule.parse(raw)


def test_rules_round_trip_through_json() -> None:
    rules = parse_rules([{"effect": "allow", "resource": "group:g-*", "actions": "consume,reset"},
                         {"effect": "deny", "resource": "admin", "actions": ["users"]}])
    assert rules[0].actions == ("consume", "reset")
    assert parse_rules([r.to_json() for r in rules]) == rules
