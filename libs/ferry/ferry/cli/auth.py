"""`ferry user ...` and `ferry acl ...`: identities and permissions (docs/security.md).

    ferry user add AK [--admin] [--secret S | --generate] [--description D]
    ferry user add AK --admin --bootstrap --etcd HOST:PORT [--etcd-prefix /ferry/]
    ferry user list | remove AK
    ferry acl grant AK --topic GLOB --perm pub,sub | --group GLOB --perm consume,reset
                       | --admin AREAS  [--deny]
    ferry acl list [AK] | revoke AK (--topic GLOB | --group GLOB | --admin | --all) [--deny|--allow]

They go through namesrv's /v1/users and /v1/acl, signed with the caller's
FERRY_ACCESS_KEY / FERRY_SECRET_KEY (an admin with the `users` area). The
secret of a new identity stays on this machine: only its derived signing key
is sent. `--bootstrap` makes the first admin by writing etcd directly, and only
while no identity exists. A generated secret is printed once; keep it.
"""
from __future__ import annotations

import argparse
import json
from typing import Any
from urllib.parse import quote

from ferry.auth.acl import ADMIN, ALLOW, DENY, admin_rules
from ferry.auth.credentials import Credentials, generate_secret, validate_access_key
from ferry.client.core.namesrv import NamesrvClient
from ferry.errors import MalformedRequestError
from ferry.routing import EtcdRegistry
from ferry.routing.registry import DEFAULT_PREFIX
from ferry.service.auth_registry import AuthRegistry

SubParsers = argparse._SubParsersAction  # type: ignore[type-arg]


def add_auth(sub: SubParsers) -> None:
    """The `user` and `acl` commands."""
    user = sub.add_parser("user", help="identities (access key + secret)")
    usub = user.add_subparsers(dest="action", required=True, metavar="ACTION")
    add = usub.add_parser("add", help="add an identity; prints its secret when generated")
    add.add_argument("access_key", help="[A-Za-z0-9_-]{3,64}")
    which = add.add_mutually_exclusive_group()
    which.add_argument("--secret", help="its secret (16..256 printable characters)")
    which.add_argument("--generate", action="store_true",
                       help="generate a random secret (the default) and print it once")
    add.add_argument("--admin", action="store_true", help="allow it everything")
    add.add_argument("--description", default="")
    add.add_argument("--bootstrap", action="store_true",
                     help="create the first admin straight in etcd (only while no identity "
                          "exists); needs --admin and --etcd")
    add.add_argument("--etcd", help="etcd endpoint(s) h:p[,h:p] for --bootstrap")
    add.add_argument("--etcd-prefix", default=DEFAULT_PREFIX,
                     help=f"the mesh's etcd prefix (default {DEFAULT_PREFIX})")
    add.set_defaults(func=user_add)
    usub.add_parser("list", help="list identities").set_defaults(func=user_list)
    remove = usub.add_parser("remove", help="remove an identity and its rules")
    remove.add_argument("access_key")
    remove.set_defaults(func=user_remove)

    acl = sub.add_parser("acl", help="permissions of identities")
    asub = acl.add_subparsers(dest="action", required=True, metavar="ACTION")
    grant = asub.add_parser("grant", help="allow (or with --deny, deny) actions on resources")
    grant.add_argument("access_key")
    _resource_args(grant, required=True)
    grant.add_argument("--perm", help="actions, comma-separated: pub,sub for a topic, "
                                      "consume,reset for a group, replicate for a broker "
                                      "(* = all)")
    grant.add_argument("--deny", action="store_true", help="a deny rule (wins over allows)")
    grant.set_defaults(func=acl_grant)
    listing = asub.add_parser("list", help="rules of one identity, or of all")
    listing.add_argument("access_key", nargs="?")
    listing.set_defaults(func=acl_list)
    revoke = asub.add_parser("revoke", help="drop an identity's rules on a resource")
    revoke.add_argument("access_key")
    _resource_args(revoke, required=True, all_option=True)
    effect = revoke.add_mutually_exclusive_group()
    effect.add_argument("--deny", action="store_true", help="only its deny rules")
    effect.add_argument("--allow", action="store_true", help="only its allow rules")
    revoke.set_defaults(func=acl_revoke)


def _resource_args(parser: argparse.ArgumentParser, *, required: bool,
                   all_option: bool = False) -> None:
    which = parser.add_mutually_exclusive_group(required=required)
    which.add_argument("--topic", metavar="GLOB", help="topics matching GLOB")
    which.add_argument("--group", metavar="GLOB", help="groups matching GLOB")
    which.add_argument("--broker", metavar="NAME/ID",
                       help="the broker ids a slave identity may link as (globs allowed)")
    if all_option:
        which.add_argument("--admin", action="store_true", help="the admin rules")
        which.add_argument("--all", action="store_true", help="every rule")
    else:
        which.add_argument("--admin", metavar="AREAS",
                           help="admin areas, comma-separated: topics, groups, users, dlq, "
                                "delay, txn, read (* = all)")


def _print(data: Any) -> None:
    print(json.dumps(data, indent=2, sort_keys=True))


async def user_add(args: argparse.Namespace) -> int:
    access_key = validate_access_key(args.access_key)
    secret = args.secret or generate_secret()
    creds = Credentials(access_key, secret)   # checks the secret's length and characters
    if args.bootstrap:
        if not args.admin or not args.etcd:
            raise MalformedRequestError("--bootstrap makes the first admin: it needs --admin "
                                        "and --etcd")
        etcd = EtcdRegistry(args.etcd, prefix=args.etcd_prefix)
        await etcd.start()
        try:
            user = await AuthRegistry(etcd).bootstrap_admin(access_key, creds.signing_key,
                                                            admin_rules(), args.description
                                                            or "bootstrap admin")
        finally:
            await etcd.stop()
        _print(user.public())
    else:
        async with _namesrv(args) as ns:
            _print(await ns.call("POST", "/v1/users", json={
                "access_key": access_key, "signing_key": creds.signing_key.hex(),
                "description": args.description, "admin": bool(args.admin)}))
    if not args.secret:
        print(f"secret: {secret}")
        print("(shown once: give it to the identity's owner as FERRY_SECRET_KEY)")
    return 0


async def user_list(args: argparse.Namespace) -> int:
    async with _namesrv(args) as ns:
        _print(await ns.call("GET", "/v1/users"))
    return 0


async def user_remove(args: argparse.Namespace) -> int:
    access_key = validate_access_key(args.access_key)
    async with _namesrv(args) as ns:
        _print(await ns.call("DELETE", "/v1/users/" + access_key))
    return 0


def rule_of(args: argparse.Namespace) -> dict[str, Any]:
    """The rule `ferry acl grant` asks for, from its options."""
    effect = DENY if args.deny else ALLOW
    if args.admin:
        return {"effect": effect, "resource": ADMIN, "actions": args.admin}
    if not args.perm:
        raise MalformedRequestError("--perm is needed with --topic, --group or --broker")
    return {"effect": effect, "resource": _resource(args), "actions": args.perm}


def _resource(args: argparse.Namespace) -> str:
    """The resource a grant or revoke names, from its options."""
    if args.admin:
        return ADMIN
    if args.topic:
        return f"topic:{args.topic}"
    return f"group:{args.group}" if args.group else f"broker:{args.broker}"


async def acl_grant(args: argparse.Namespace) -> int:
    access_key = validate_access_key(args.access_key)
    async with _namesrv(args) as ns:
        _print(await ns.call("POST", "/v1/acl/" + access_key, json={"rules": [rule_of(args)]}))
    return 0


async def acl_list(args: argparse.Namespace) -> int:
    path = "/v1/acl" if not args.access_key else "/v1/acl/" + validate_access_key(args.access_key)
    async with _namesrv(args) as ns:
        _print(await ns.call("GET", path))
    return 0


async def acl_revoke(args: argparse.Namespace) -> int:
    access_key = validate_access_key(args.access_key)
    params: dict[str, str] = {}
    if not args.all:
        params["resource"] = _resource(args)
    if args.deny or args.allow:
        params["effect"] = DENY if args.deny else ALLOW
    async with _namesrv(args) as ns:
        _print(await ns.call("DELETE", "/v1/acl/" + quote(access_key), params=params))
    return 0


class _namesrv:  # noqa: N801 - used as `async with _namesrv(args)`
    """A NamesrvClient for one command, closed after it."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.client = NamesrvClient(args.namesrv)

    async def __aenter__(self) -> NamesrvClient:
        await self.client.start()
        return self.client

    async def __aexit__(self, *exc: object) -> None:
        await self.client.close()
