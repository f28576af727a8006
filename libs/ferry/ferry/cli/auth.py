"""`ferry user ...` and `ferry acl ...`: identities and permissions (docs/security.md).

    ferry user add AK [--admin] [--generate | --secret-file PATH|-] [--description D]
    ferry user add AK --admin --bootstrap --etcd HOST:PORT [--etcd-prefix /ferry/]
    ferry user list | remove AK
    ferry acl grant AK --topic GLOB --perm pub,sub | --group GLOB --perm consume,reset
                       | --scene GLOB --perm claim | --admin AREAS  [--deny]
    ferry acl list [AK] | revoke AK (--topic GLOB | --group GLOB | --scene GLOB | --admin
                                     | --all) [--deny|--allow]

They go through namesrv's /v1/users and /v1/acl, signed with the caller's
FERRY_ACCESS_KEY / FERRY_SECRET_KEY (an admin with the `users` area); with
`--etcd HOST:PORT` they write etcd directly instead, the way to make identities
before auth is on (namesrv refuses these routes while it is off; identities.py).
The secret of a new identity stays on this machine: only its derived signing key
is sent. `--bootstrap` makes the first admin, only while no identity exists. A
generated secret is printed once; keep it. A secret is never an argument
(secret_input.py).
"""
from __future__ import annotations

import argparse
import json
from typing import Any

from ferry.auth.acl import ADMIN, ALLOW, DENY, admin_rules
from ferry.auth.credentials import Credentials, generate_secret, validate_access_key
from ferry.cli.identities import identity_store
from ferry.cli.secret_input import RefuseSecretOption, read_secret
from ferry.errors import MalformedRequestError
from ferry.routing import EtcdRegistry
from ferry.routing.registry import DEFAULT_PREFIX
from ferry.service.auth_registry import AuthRegistry

SubParsers = argparse._SubParsersAction  # type: ignore[type-arg]


def add_auth(sub: SubParsers) -> None:
    """The `user` and `acl` commands."""
    user = sub.add_parser("user", help="identities (access key + secret)")
    usub = user.add_subparsers(dest="action", required=True, metavar="ACTION")
    add = usub.add_parser("add", help="add an identity; prints its secret when generated",
                          allow_abbrev=False)
    add.add_argument("access_key", help="[A-Za-z0-9_-]{3,64}")
    which = add.add_mutually_exclusive_group()
    which.add_argument("--generate", action="store_true",
                       help="generate a random secret (the default) and print it once")
    which.add_argument("--secret-file", metavar="PATH",
                       help="read its secret (16..256 printable characters, one line) from "
                            "PATH; - reads standard input (a prompt without echo on a terminal)")
    which.add_argument("--secret", action=RefuseSecretOption, help=argparse.SUPPRESS)
    add.add_argument("--admin", action="store_true", help="allow it everything")
    add.add_argument("--description", default="")
    add.add_argument("--bootstrap", action="store_true",
                     help="create the first admin straight in etcd (only while no identity "
                          "exists); needs --admin and --etcd")
    _etcd_args(add)
    add.set_defaults(func=user_add)
    _etcd_args(usub.add_parser("list", help="list identities")).set_defaults(func=user_list)
    remove = _etcd_args(usub.add_parser("remove", help="remove an identity and its rules"))
    remove.add_argument("access_key")
    remove.set_defaults(func=user_remove)

    acl = sub.add_parser("acl", help="permissions of identities")
    asub = acl.add_subparsers(dest="action", required=True, metavar="ACTION")
    grant = _etcd_args(asub.add_parser(
        "grant", help="allow (or with --deny, deny) actions on resources"))
    grant.add_argument("access_key")
    _resource_args(grant, required=True)
    grant.add_argument("--perm", help="actions, comma-separated: pub,sub for a topic, "
                                      "consume,reset for a group, claim for a scene, "
                                      "replicate for a broker "
                                      "(* = all)")
    grant.add_argument("--deny", action="store_true", help="a deny rule (wins over allows)")
    grant.set_defaults(func=acl_grant)
    listing = _etcd_args(asub.add_parser("list", help="rules of one identity, or of all"))
    listing.add_argument("access_key", nargs="?")
    listing.set_defaults(func=acl_list)
    revoke = _etcd_args(asub.add_parser("revoke", help="drop an identity's rules on a resource"))
    revoke.add_argument("access_key")
    _resource_args(revoke, required=True, all_option=True)
    effect = revoke.add_mutually_exclusive_group()
    effect.add_argument("--deny", action="store_true", help="only its deny rules")
    effect.add_argument("--allow", action="store_true", help="only its allow rules")
    revoke.set_defaults(func=acl_revoke)


def _etcd_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("--etcd", metavar="HOST:PORT[,...]",
                        help="write etcd directly instead of going through namesrv: how "
                             "identities are made before auth is on (docs/security.md)")
    parser.add_argument("--etcd-prefix", default=DEFAULT_PREFIX,
                        help=f"the mesh's etcd prefix (default {DEFAULT_PREFIX})")
    return parser


def _resource_args(parser: argparse.ArgumentParser, *, required: bool,
                   all_option: bool = False) -> None:
    which = parser.add_mutually_exclusive_group(required=required)
    which.add_argument("--topic", metavar="GLOB", help="topics matching GLOB")
    which.add_argument("--group", metavar="GLOB", help="groups matching GLOB")
    which.add_argument("--scene", metavar="GLOB",
                       help="idempotence scenes matching GLOB (dedup claims)")
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
    secret = read_secret(args.secret_file) if args.secret_file else generate_secret()
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
        async with identity_store(args) as store:
            _print(await store.add_user(creds, args.description, bool(args.admin)))
    if not args.secret_file:
        print(f"secret: {secret}")
        print("(shown once: give it to the identity's owner as FERRY_SECRET_KEY)")
    return 0


async def user_list(args: argparse.Namespace) -> int:
    async with identity_store(args) as store:
        _print(await store.list_users())
    return 0


async def user_remove(args: argparse.Namespace) -> int:
    access_key = validate_access_key(args.access_key)
    async with identity_store(args) as store:
        _print(await store.remove_user(access_key))
    return 0


def rule_of(args: argparse.Namespace) -> dict[str, Any]:
    """The rule `ferry acl grant` asks for, from its options."""
    effect = DENY if args.deny else ALLOW
    if args.admin:
        return {"effect": effect, "resource": ADMIN, "actions": args.admin}
    if not args.perm:
        raise MalformedRequestError("--perm is needed with --topic, --group, --scene or --broker")
    return {"effect": effect, "resource": _resource(args), "actions": args.perm}


def _resource(args: argparse.Namespace) -> str:
    """The resource a grant or revoke names, from its options."""
    if args.admin:
        return ADMIN
    for kind in ("topic", "group", "scene", "broker"):
        glob = getattr(args, kind, None)
        if glob:
            return f"{kind}:{glob}"
    raise MalformedRequestError("name a resource: --topic, --group, --scene, --broker or --admin")


async def acl_grant(args: argparse.Namespace) -> int:
    access_key = validate_access_key(args.access_key)
    async with identity_store(args) as store:
        _print(await store.grant(access_key, rule_of(args)))
    return 0


async def acl_list(args: argparse.Namespace) -> int:
    access_key = validate_access_key(args.access_key) if args.access_key else None
    async with identity_store(args) as store:
        _print(await store.list_rules(access_key))
    return 0


async def acl_revoke(args: argparse.Namespace) -> int:
    access_key = validate_access_key(args.access_key)
    params: dict[str, str] = {}
    if not args.all:
        params["resource"] = _resource(args)
    if args.deny or args.allow:
        params["effect"] = DENY if args.deny else ALLOW
    async with identity_store(args) as store:
        _print(await store.revoke(access_key, params))
    return 0
