"""Identities and their permissions in etcd, and a live in-memory copy of them.

Keys, under the registry's prefix (`/ferry/` by default):

    auth/users/<access key>   JSON {"key": derived signing key hex, "created_ms",
                              "description", "enabled"}
    auth/acl/<access key>     JSON list of rules [{"effect", "resource", "actions"}]
    auth/bootstrapped         written once, by the first admin's bootstrap

Only the derived signing key is stored, never the secret (docs/security.md).
`AuthRegistry.start()` reads everything once and then follows an etcd watch
(reloading after a lost watch, as `ferry.routing.RegistryCache` does), so a
broker or namesrv refuses a removed identity within moments, without a restart.
"""
from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ferry.auth.acl import MAX_RULES_PER_IDENTITY, Acl, Rule, parse_rules
from ferry.auth.credentials import SIGNING_KEY_BYTES, validate_access_key
from ferry.errors import AlreadyExistsError, BusyError, MalformedRequestError
from ferry.routing.follow import PrefixFollower
from ferry.routing.registry import EtcdRegistry
from ferry.tasks import cancel_and_wait

log = logging.getLogger(__name__)

#: The longest description kept with an identity.
MAX_DESCRIPTION_CHARS = 256
#: Tries of one rule change while other writers keep changing the same identity's rules
#: (each round lets at least one writer through, so this many concurrent writers all land).
MAX_RULE_WRITE_ATTEMPTS = 100
#: The pause between tries grows up to 8 times this (random below it).
RULE_WRITE_BACKOFF_S = 0.005

#: A change of an identity's rules: the rules it holds -> the rules it is to hold.
RulesChange = Callable[[tuple[Rule, ...]], tuple[Rule, ...]]


@dataclass(frozen=True, slots=True)
class User:
    """One identity as servers know it: its derived signing key, never its secret."""

    access_key: str
    signing_key: bytes = field(repr=False)   # a log line or traceback never shows it
    created_ms: int
    description: str = ""
    enabled: bool = True

    def to_json(self) -> bytes:
        return json.dumps({"key": self.signing_key.hex(), "created_ms": self.created_ms,
                           "description": self.description, "enabled": self.enabled}).encode()

    def public(self) -> dict[str, Any]:
        """What the API lists: everything but the key."""
        return {"access_key": self.access_key, "created_ms": self.created_ms,
                "description": self.description, "enabled": self.enabled}

    @classmethod
    def from_json(cls, access_key: str, raw: bytes) -> User:
        try:
            data = json.loads(raw)
            key = bytes.fromhex(data["key"])
            if len(key) != SIGNING_KEY_BYTES:
                raise ValueError("signing key is not 32 bytes")
            return cls(access_key, key, int(data.get("created_ms", 0)),
                       str(data.get("description", "")), bool(data.get("enabled", True)))
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"invalid user record for {access_key!r}: {exc}") from None


class AuthRegistry(PrefixFollower):
    """Users and ACLs under `<prefix>auth/`, read and written through an EtcdRegistry."""

    what = "auth registry"

    def __init__(self, etcd: EtcdRegistry) -> None:
        super().__init__(etcd)
        self.etcd = etcd
        self.users: dict[str, User] = {}
        self.acl = Acl()
        self._revision = 0
        self._task: asyncio.Task[None] | None = None

    # -- keys ----------------------------------------------------------------------------

    @property
    def _root(self) -> str:
        return f"{self.etcd.prefix}auth/"

    def user_key(self, access_key: str) -> bytes:
        return f"{self._root}users/{validate_access_key(access_key)}".encode()

    def acl_key(self, access_key: str) -> bytes:
        return f"{self._root}acl/{validate_access_key(access_key)}".encode()

    @property
    def _bootstrap_key(self) -> bytes:
        return f"{self._root}bootstrapped".encode()

    # -- what servers ask ----------------------------------------------------------------

    def signing_key(self, access_key: str) -> bytes | None:
        """The derived key of an enabled identity; None when unknown or disabled."""
        user = self.users.get(access_key)
        return user.signing_key if user is not None and user.enabled else None

    def allows(self, access_key: str, action: str, resource: str) -> bool:
        """The current rules' decision. Hand this method (not `acl.allows`) to checkers:
        a reload replaces `acl` with a new object."""
        return self.acl.allows(access_key, action, resource)

    # -- lifecycle -----------------------------------------------------------------------

    async def start(self) -> None:
        """Load everything once, then follow changes in a task."""
        await self._load()
        self._task = asyncio.create_task(self._run(), name="auth-registry-watch")

    async def stop(self) -> None:
        task, self._task = self._task, None
        await cancel_and_wait(task)

    async def _load(self) -> None:
        got = await self.etcd.client.get_prefix(self._root.encode())
        users: dict[str, User] = {}
        acl = Acl()
        for kv in got:
            self._apply_put(kv.key, kv.value, users, acl)
        self.users, self.acl = users, acl
        self._revision = int(got.header.revision)

    def _watch_from(self) -> tuple[bytes, int]:
        return self._root.encode(), self._revision

    async def _apply_event(self, kind: str, key: bytes, value: bytes, revision: int) -> None:
        if kind == "DELETE":
            self._apply_delete(key)
        else:
            self._apply_put(key, value, self.users, self.acl)
        self._revision = max(self._revision, revision)

    def _split(self, key: bytes) -> tuple[str, str]:
        rel = key.decode(errors="replace")[len(self._root):]
        kind, _, access_key = rel.partition("/")
        return kind, access_key

    def _apply_put(self, key: bytes, value: bytes, users: dict[str, User], acl: Acl) -> None:
        """Take one key's value; an invalid one is logged and skipped (never fatal)."""
        kind, access_key = self._split(key)
        try:
            if kind == "users":
                users[access_key] = User.from_json(access_key, value)
            elif kind == "acl":
                acl.set_rules(access_key, parse_rules(json.loads(value)))
        except (ValueError, MalformedRequestError) as exc:
            log.warning("ignoring invalid auth record at %s: %s", key.decode(errors="replace"), exc)
            # A broken rule list must not leave older, wider rules in force.
            if kind == "acl":
                acl.set_rules(access_key, ())
            elif kind == "users":
                users.pop(access_key, None)

    def _apply_delete(self, key: bytes) -> None:
        kind, access_key = self._split(key)
        if kind == "users":
            self.users.pop(access_key, None)
        elif kind == "acl":
            self.acl.remove(access_key)

    # -- writes (namesrv's /v1/users and /v1/acl, `ferry user|acl --etcd`, the bootstrap) --

    async def add_user(self, access_key: str, signing_key: bytes, description: str = "",
                       rules: tuple[Rule, ...] = ()) -> User:
        """Create an identity (and its rules); AlreadyExistsError when the key is taken."""
        user = self._new_user(access_key, signing_key, description)
        tx = self.etcd.client.transactions
        key = self.user_key(access_key)
        ok, _ = await self.etcd.client.transaction(
            compare=[tx.create(key) == 0],
            success=[tx.put(key, user.to_json()),
                     tx.put(self.acl_key(access_key), _rules_json(rules))],
            failure=[])
        if not ok:
            raise AlreadyExistsError(f"access key {access_key!r} already exists")
        return user

    async def bootstrap_admin(self, access_key: str, signing_key: bytes, rules: tuple[Rule, ...],
                              description: str = "bootstrap admin") -> User:
        """Create the first identity, only while no identity exists and none ever was bootstrapped."""
        if await self.etcd.client.get_prefix(f"{self._root}users/".encode()):
            raise AlreadyExistsError("identities exist already: add users through namesrv "
                                     "(`ferry user add`) signed by an admin")
        user = self._new_user(access_key, signing_key, description)
        tx = self.etcd.client.transactions
        marker = self._bootstrap_key
        ok, _ = await self.etcd.client.transaction(
            compare=[tx.create(marker) == 0],
            success=[tx.put(marker, str(user.created_ms).encode()),
                     tx.put(self.user_key(access_key), user.to_json()),
                     tx.put(self.acl_key(access_key), _rules_json(rules))],
            failure=[])
        if not ok:
            raise AlreadyExistsError("this mesh was bootstrapped already")
        return user

    async def remove_user(self, access_key: str) -> bool:
        """Delete an identity and its rules, in one transaction; False when it did not exist."""
        tx = self.etcd.client.transactions
        user_key = self.user_key(access_key)
        ok, _ = await self.etcd.client.transaction(
            compare=[tx.version(user_key) > 0],
            success=[tx.delete(user_key), tx.delete(self.acl_key(access_key))],
            failure=[tx.delete(self.acl_key(access_key))])
        return bool(ok)

    async def list_users(self) -> list[User]:
        out = []
        for kv in await self.etcd.client.get_prefix(f"{self._root}users/".encode()):
            try:
                out.append(User.from_json(self._split(kv.key)[1], kv.value))
            except ValueError as exc:
                log.warning("skipping invalid user record: %s", exc)
        return sorted(out, key=lambda u: u.access_key)

    async def get_rules(self, access_key: str) -> tuple[Rule, ...]:
        got = await self.etcd.client.get(self.acl_key(access_key))
        return () if got is None else parse_rules(json.loads(got.value))

    async def set_rules(self, access_key: str, rules: tuple[Rule, ...]) -> None:
        """Replace an identity's rules (the identity must exist)."""
        await self.update_rules(access_key, lambda _old: rules)

    async def grant_rules(self, access_key: str, added: tuple[Rule, ...]) -> tuple[Rule, ...]:
        """Add rules to an identity's (a rule it holds already is kept once); the new rules."""
        def merge(rules: tuple[Rule, ...]) -> tuple[Rule, ...]:
            merged = tuple(dict.fromkeys((*rules, *added)))
            if len(merged) > MAX_RULES_PER_IDENTITY:
                raise MalformedRequestError(f"at most {MAX_RULES_PER_IDENTITY} rules per "
                                            "identity")
            return merged
        return (await self.update_rules(access_key, merge))[1]

    async def revoke_rules(self, access_key: str, resource: str | None,
                           effect: str | None = None) -> tuple[tuple[Rule, ...], tuple[Rule, ...]]:
        """Drop an identity's rules on `resource` (only those of `effect` when given; every
        rule when `resource` is None): (the rules before, the rules kept)."""
        return await self.update_rules(access_key, lambda rules: tuple(
            r for r in rules if resource is not None and (
                r.resource != resource or (effect is not None and r.effect != effect))))

    async def update_rules(self, access_key: str, change: RulesChange
                           ) -> tuple[tuple[Rule, ...], tuple[Rule, ...]]:
        """Apply `change` to an identity's rules as an etcd transaction: (before, after).

        The write compares the rules' mod revision with the one read, so a rule
        another writer (another namesrv, the CLI on etcd) stored in between is
        never lost: the change is applied again to what is there now. An
        identity that does not exist (or was removed meanwhile) gets no rules.
        """
        client = self.etcd.client
        tx = client.transactions
        user_key, acl_key = self.user_key(access_key), self.acl_key(access_key)
        for attempt in range(MAX_RULE_WRITE_ATTEMPTS):
            if await client.get(user_key) is None:
                raise MalformedRequestError(f"no identity {access_key!r}")
            got = await client.get(acl_key)
            before = () if got is None else parse_rules(json.loads(got.value))
            after = change(before)
            ok, _ = await client.transaction(
                compare=[tx.version(user_key) > 0,
                         tx.mod(acl_key) == (0 if got is None else got.mod_revision)],
                success=[tx.put(acl_key, _rules_json(after))], failure=[])
            if ok:
                return before, after
            # Someone wrote in between: read again, after a short random pause so that
            # many writers of one identity do not keep colliding in step.
            await asyncio.sleep(random.uniform(0, RULE_WRITE_BACKOFF_S * min(attempt + 1, 8)))
        raise BusyError(f"the rules of {access_key!r} kept changing during "
                        f"{MAX_RULE_WRITE_ATTEMPTS} attempts to write them; try again")

    @staticmethod
    def _new_user(access_key: str, signing_key: bytes, description: str) -> User:
        validate_access_key(access_key)
        if len(signing_key) != SIGNING_KEY_BYTES:
            raise MalformedRequestError("a signing key is 32 bytes")
        if len(description) > MAX_DESCRIPTION_CHARS:
            raise MalformedRequestError(f"a description has at most {MAX_DESCRIPTION_CHARS} "
                                        "characters")
        return User(access_key, signing_key, int(time.time() * 1000), description)


def _rules_json(rules: tuple[Rule, ...]) -> bytes:
    return json.dumps([r.to_json() for r in rules]).encode()
