"""Where `ferry user` and `ferry acl` keep identities: through namesrv, or straight in etcd.

Through namesrv (the usual way, with auth on) a command is signed with the
caller's FERRY_ACCESS_KEY / FERRY_SECRET_KEY, an identity with admin `users`.
With `--etcd` it writes etcd itself, as `--bootstrap` does: the way to create
identities before a mesh turns auth on, while namesrv refuses identity routes
(docs/security.md, "Turning auth on"). Whoever can write etcd is root anyway;
no one else can use this path. Both answer with the same JSON.
"""
from __future__ import annotations

import argparse
from typing import Any, Protocol
from urllib.parse import quote

from ferry.auth.acl import Rule, admin_rules, parse_rules
from ferry.auth.credentials import Credentials
from ferry.client.core.namesrv import NamesrvClient
from ferry.errors import MalformedRequestError
from ferry.routing import EtcdRegistry
from ferry.service.auth_registry import AuthRegistry


class IdentityStore(Protocol):
    """What the commands do, wherever the identities live."""

    async def add_user(self, creds: Credentials, description: str, admin: bool) -> Any: ...
    async def list_users(self) -> Any: ...
    async def remove_user(self, access_key: str) -> Any: ...
    async def grant(self, access_key: str, rule: dict[str, Any]) -> Any: ...
    async def list_rules(self, access_key: str | None) -> Any: ...
    async def revoke(self, access_key: str, params: dict[str, str]) -> Any: ...


def _rules_json(access_key: str, rules: tuple[Rule, ...]) -> dict[str, Any]:
    return {"access_key": access_key, "rules": [r.to_json() for r in rules]}


class NamesrvStore:
    """namesrv's /v1/users and /v1/acl, signed by the caller."""

    def __init__(self, client: NamesrvClient) -> None:
        self.client = client

    async def add_user(self, creds: Credentials, description: str, admin: bool) -> Any:
        return await self.client.call("POST", "/v1/users", json={
            "access_key": creds.access_key, "signing_key": creds.signing_key.hex(),
            "description": description, "admin": admin})

    async def list_users(self) -> Any:
        return await self.client.call("GET", "/v1/users")

    async def remove_user(self, access_key: str) -> Any:
        return await self.client.call("DELETE", "/v1/users/" + quote(access_key))

    async def grant(self, access_key: str, rule: dict[str, Any]) -> Any:
        return await self.client.call("POST", "/v1/acl/" + quote(access_key),
                                      json={"rules": [rule]})

    async def list_rules(self, access_key: str | None) -> Any:
        return await self.client.call("GET", "/v1/acl" if access_key is None
                                      else "/v1/acl/" + quote(access_key))

    async def revoke(self, access_key: str, params: dict[str, str]) -> Any:
        return await self.client.call("DELETE", "/v1/acl/" + quote(access_key), params=params)


class EtcdStore:
    """The identities in etcd, written directly (the bootstrap path)."""

    def __init__(self, registry: AuthRegistry) -> None:
        self.registry = registry

    async def add_user(self, creds: Credentials, description: str, admin: bool) -> Any:
        user = await self.registry.add_user(creds.access_key, creds.signing_key, description,
                                            admin_rules() if admin else ())
        return user.public()

    async def list_users(self) -> Any:
        return {"users": [u.public() for u in await self.registry.list_users()]}

    async def remove_user(self, access_key: str) -> Any:
        if not await self.registry.remove_user(access_key):
            raise MalformedRequestError(f"no identity {access_key!r}")
        return {"deleted": access_key}

    async def grant(self, access_key: str, rule: dict[str, Any]) -> Any:
        return _rules_json(access_key, await self.registry.grant_rules(access_key,
                                                                       parse_rules([rule])))

    async def list_rules(self, access_key: str | None) -> Any:
        if access_key is not None:
            return _rules_json(access_key, await self.registry.get_rules(access_key))
        return {"acl": {u.access_key: [r.to_json() for r in
                                       await self.registry.get_rules(u.access_key)]
                        for u in await self.registry.list_users()}}

    async def revoke(self, access_key: str, params: dict[str, str]) -> Any:
        rules, kept = await self.registry.revoke_rules(access_key, params.get("resource"),
                                                       params.get("effect"))
        return {**_rules_json(access_key, kept), "removed": len(rules) - len(kept)}


class identity_store:  # noqa: N801 - used as `async with identity_store(args) as store`
    """The store a command's options name (`--etcd`: etcd itself; else namesrv), open for
    the command and closed after it."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.etcd = (EtcdRegistry(args.etcd, prefix=args.etcd_prefix)
                     if getattr(args, "etcd", None) else None)
        self.namesrv = NamesrvClient(args.namesrv) if self.etcd is None else None

    async def __aenter__(self) -> IdentityStore:
        if self.etcd is not None:
            await self.etcd.start()
            return EtcdStore(AuthRegistry(self.etcd))
        assert self.namesrv is not None
        await self.namesrv.start()
        return NamesrvStore(self.namesrv)

    async def __aexit__(self, *exc: object) -> None:
        if self.etcd is not None:
            await self.etcd.stop()
        if self.namesrv is not None:
            await self.namesrv.close()
