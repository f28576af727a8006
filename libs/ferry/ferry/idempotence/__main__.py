"""`python -m ferry.idempotence`: create the ledger's schema, look rows up.

    python -m ferry.idempotence create-schema sqlite:///var/app.db [--table T]
    python -m ferry.idempotence create-schema postgresql://user@host:5432/app
    python -m ferry.idempotence lookup URL --scene billing --biz-key order-1
    python -m ferry.idempotence lookup URL --msg-id 0A1B...

A `sqlite:///PATH` URL opens the file with sqlite3; a `postgresql://` (or
`postgres://`) URL connects with psycopg 3. Look-ups print one JSON object per
ledger row. Exit status: 0 done, 1 nothing found, 2 bad usage or database error.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sqlite3
import sys
from typing import Any

from ferry.errors import FerryError
from ferry.idempotence.ledger import DEFAULT_TABLE, Ledger

SQLITE_URL_PREFIX = "sqlite:///"
POSTGRES_URL_PREFIXES = ("postgresql://", "postgres://")


def connect(url: str) -> Any:
    """A sync connection for `url` (not in autocommit mode): sqlite3 or psycopg."""
    if url.startswith(SQLITE_URL_PREFIX):
        return sqlite3.connect(url[len(SQLITE_URL_PREFIX):], timeout=30)
    if url.startswith(POSTGRES_URL_PREFIXES):
        import psycopg
        return psycopg.connect(url)
    raise FerryError(f"unsupported database URL {url!r}: use sqlite:///PATH or postgresql://...")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m ferry.idempotence",
                                description="The idempotence ledger's schema and look-ups.")
    sub = p.add_subparsers(dest="command", required=True)
    create = sub.add_parser("create-schema", help="create the ledger table and indexes (idempotent)")
    lookup = sub.add_parser("lookup", help="ledger rows by business key or by message id")
    for cmd in (create, lookup):
        cmd.add_argument("url", help="sqlite:///PATH or postgresql://...")
        cmd.add_argument("--table", default=DEFAULT_TABLE)
    lookup.add_argument("--scene")
    lookup.add_argument("--biz-key")
    lookup.add_argument("--msg-id")
    return p


def run(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    if args.command == "lookup" and not (args.msg_id or (args.scene and args.biz_key)):
        print("lookup: give --msg-id, or --scene and --biz-key", file=sys.stderr)
        return 2
    try:
        ledger = Ledger(table=args.table)
        conn = connect(args.url)
    except (FerryError, OSError, ImportError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        if args.command == "create-schema":
            ledger.create_schema(conn)
            conn.commit()
            print(f"ledger table {args.table} ready")
            return 0
        if args.msg_id:
            rows = ledger.by_msg_id(conn, args.msg_id)
        else:
            one = ledger.by_biz_key(conn, scene=args.scene, biz_key=args.biz_key)
            rows = [] if one is None else [one]
        for row in rows:
            print(json.dumps(dataclasses.asdict(row)))
        return 0 if rows else 1
    except Exception as exc:  # a database error: say it, do not dump a trace
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    finally:
        conn.close()


def main() -> None:
    sys.exit(run(sys.argv[1:]))


if __name__ == "__main__":
    main()
