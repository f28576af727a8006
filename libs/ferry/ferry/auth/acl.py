"""Permissions: rules per identity, wildcards, deny over allow, default deny.

A rule is {effect: allow|deny, resource, actions}. Resources:

- `topic:<glob>` — actions `pub` (send), `sub` (read its messages);
- `group:<glob>` — actions `consume` (pull, commit, heartbeat, locks, nack as
  that group), `reset` (move the group's offsets);
- `scene:<glob>` — action `claim` (the dedup service's claim, confirm and
  release in that idempotence scene);
- `broker:<name glob>/<id glob>` — action `replicate` (link to the group's master
  as that broker id, e.g. `broker:broker-a/1`);
- `admin` — actions are areas: `topics`, `groups`, `users`, `dlq`, `delay`,
  `txn`, `read` (stats and queries).

`*` in `actions` means every action of the resource. Globs are fnmatch-style
(`*`, `?`, `[..]`, case-sensitive); a glob that does not itself start with `%`
never matches an internal name (`%RETRY%g`, `%SCHEDULE%`...), so `topic:*`
grants the user topics only. A request is allowed when some allow rule of
its identity matches and no deny rule does.
"""
from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ferry.errors import AccessDeniedError, MalformedRequestError

ALLOW = "allow"
DENY = "deny"
EFFECTS = (ALLOW, DENY)
#: Actions per resource kind; "*" stands for all of them.
ACTIONS: dict[str, tuple[str, ...]] = {
    "topic": ("pub", "sub"),
    "group": ("consume", "reset"),
    "scene": ("claim",),
    "broker": ("replicate",),
    "admin": ("topics", "groups", "users", "dlq", "delay", "txn", "read"),
}
ANY_ACTION = "*"
#: A glob is a name pattern: name characters, the glob characters, and % for internal names.
_GLOB = re.compile(r"[A-Za-z0-9_%*?\[\]!-]{1,200}")
#: Scenes (ferry.idempotence.keys) may hold dots too; none is internal, so no %.
_SCENE_GLOB = re.compile(r"[A-Za-z0-9_.*?\[\]!-]{1,200}")
#: A broker pattern: a group name glob, "/", a broker id glob (`*` alone: every broker).
_BROKER_GLOB = re.compile(r"\*|[A-Za-z0-9_*?\[\]!-]{1,127}/[0-9*?\[\]!-]{1,20}")
#: Decisions cached per (access key, action, resource); the cache is cleared past this.
MAX_CACHED_DECISIONS = 65_536
#: Rules per identity at most (a limit like every other).
MAX_RULES_PER_IDENTITY = 1000


def _kind_of(resource: str) -> tuple[str, str]:
    kind, _, name = resource.partition(":")
    return kind, name


@dataclass(frozen=True, slots=True)
class Rule:
    """One permission rule: allow or deny `actions` on the resources `resource` names."""

    effect: str
    resource: str
    actions: tuple[str, ...]

    @classmethod
    def parse(cls, raw: object) -> Rule:
        """A Rule from its JSON form, checked; MalformedRequestError says what is wrong."""
        if not isinstance(raw, Mapping):
            raise MalformedRequestError("a rule is an object {effect, resource, actions}")
        effect, resource, actions = raw.get("effect"), raw.get("resource"), raw.get("actions")
        if effect not in EFFECTS:
            raise MalformedRequestError(f"a rule's effect is 'allow' or 'deny', not {effect!r}")
        if not isinstance(resource, str):
            raise MalformedRequestError("a rule's resource is a string")
        kind, name = _kind_of(resource)
        if kind not in ACTIONS or (kind == "admin") != (resource == "admin"):
            raise MalformedRequestError(
                f"bad resource {resource!r}: use topic:<glob>, group:<glob>, scene:<glob>, "
                "broker:<name>/<id> or admin")
        if kind == "broker" and not _BROKER_GLOB.fullmatch(name):
            raise MalformedRequestError(f"bad broker pattern {name!r} in resource {resource!r}: "
                                        "use broker:<name>/<id>, globs allowed")
        if kind not in ("admin", "broker") and not (
                _SCENE_GLOB if kind == "scene" else _GLOB).fullmatch(name):
            raise MalformedRequestError(f"bad name pattern {name!r} in resource {resource!r}")
        if isinstance(actions, str):
            actions = [a.strip() for a in actions.split(",") if a.strip()]
        if not isinstance(actions, list | tuple) or not actions:
            raise MalformedRequestError("a rule's actions are a non-empty list")
        allowed = ACTIONS[kind] + (ANY_ACTION,)
        if kind == "admin" and "replicate" in actions:
            raise MalformedRequestError(
                "admin 'replicate' was replaced by 'replicate' on broker:<name>/<id>: a slave's "
                "identity is granted the broker ids it may link as (docs/security.md)")
        for action in actions:
            if action not in allowed:
                raise MalformedRequestError(
                    f"action {action!r} does not apply to {kind}: use {', '.join(allowed)}")
        return cls(str(effect), resource, tuple(dict.fromkeys(actions)))

    def to_json(self) -> dict[str, Any]:
        return {"effect": self.effect, "resource": self.resource, "actions": list(self.actions)}

    def matches(self, action: str, resource: str) -> bool:
        """Whether this rule speaks about `action` on the concrete `resource`."""
        if ANY_ACTION not in self.actions and action not in self.actions:
            return False
        kind, name = _kind_of(resource)
        rule_kind, pattern = _kind_of(self.resource)
        if kind != rule_kind:
            return False
        if kind == "admin":
            return True
        if name.startswith("%") and not pattern.startswith("%"):
            return False  # internal names only match patterns written for them
        return fnmatch.fnmatchcase(name, pattern)


def parse_rules(raw: object) -> tuple[Rule, ...]:
    """The rules of one identity from their JSON list."""
    if not isinstance(raw, list):
        raise MalformedRequestError("an identity's rules are a JSON list")
    if len(raw) > MAX_RULES_PER_IDENTITY:
        raise MalformedRequestError(f"at most {MAX_RULES_PER_IDENTITY} rules per identity")
    return tuple(Rule.parse(r) for r in raw)


def admin_rules() -> tuple[Rule, ...]:
    """What `ferry user add --admin` grants: every action on everything, internal names too."""
    return (Rule(ALLOW, "admin", (ANY_ACTION,)), Rule(ALLOW, "topic:*", (ANY_ACTION,)),
            Rule(ALLOW, "topic:%*", (ANY_ACTION,)), Rule(ALLOW, "group:*", (ANY_ACTION,)),
            Rule(ALLOW, "scene:*", (ANY_ACTION,)), Rule(ALLOW, "broker:*", (ANY_ACTION,)))


def topic_resource(topic: str) -> str:
    return "topic:" + topic


def group_resource(group: str) -> str:
    return "group:" + group


def scene_resource(scene: str) -> str:
    return "scene:" + scene


def broker_resource(name: str, broker_id: int) -> str:
    """The resource a slave replicates as: broker `broker_id` of group `name`."""
    return f"broker:{name}/{broker_id}"


ADMIN = "admin"


class Acl:
    """Every identity's rules, and the decision for one request (cached)."""

    def __init__(self, rules: Mapping[str, Iterable[Rule]] | None = None) -> None:
        self._rules: dict[str, tuple[Rule, ...]] = {}
        self._cache: dict[tuple[str, str, str], bool] = {}
        for access_key, its_rules in (rules or {}).items():
            self._rules[access_key] = tuple(its_rules)

    def set_rules(self, access_key: str, rules: Iterable[Rule]) -> None:
        """Replace an identity's rules (empty: it may do nothing)."""
        self._rules[access_key] = tuple(rules)
        self._cache.clear()

    def remove(self, access_key: str) -> None:
        self._rules.pop(access_key, None)
        self._cache.clear()

    def rules(self, access_key: str) -> tuple[Rule, ...]:
        return self._rules.get(access_key, ())

    def allows(self, access_key: str, action: str, resource: str) -> bool:
        """Whether `access_key` may do `action` on `resource` (deny beats allow; default deny)."""
        key = (access_key, action, resource)
        decision = self._cache.get(key)
        if decision is None:
            decision = self._decide(access_key, action, resource)
            if len(self._cache) >= MAX_CACHED_DECISIONS:
                self._cache.clear()
            self._cache[key] = decision
        return decision

    def check(self, access_key: str, action: str, resource: str) -> None:
        """Raise AccessDeniedError naming the action and resource unless allowed."""
        if not self.allows(access_key, action, resource):
            raise AccessDeniedError(
                f"access denied: {access_key!r} may not {action!r} on {resource!r}")

    def _decide(self, access_key: str, action: str, resource: str) -> bool:
        allowed = False
        for rule in self._rules.get(access_key, ()):
            if rule.matches(action, resource):
                if rule.effect == DENY:
                    return False
                allowed = True
        return allowed
