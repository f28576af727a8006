"""`ferry dedup reconcile | reports | lookup`: the dedup service's reconciliation and ledger.

    ferry dedup reconcile --topic orders --group billing [--scene S]
                          [--since 1h | --from-ms MS [--to-ms MS]] [--grace-ms MS]
    ferry dedup reports [--limit N] [--id REPORT_ID]
    ferry dedup lookup --scene billing --biz-key order-17 | --msg-id ID

Each asks the service over HTTP (`--dedup`, env FERRY_DEDUP, default
127.0.0.1:10926; addresses "h:p,h:p" are tried in turn) and prints JSON.
Exit status: 0 done, 1 a Ferry error (nothing found by a look-up, an unknown
report or topic, the service or its Redis / database unreachable).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import time
from typing import Any

from ferry.auth.credentials import Credentials
from ferry.client.core.namesrv import HttpApi
from ferry.errors import (
    MalformedRequestError,
    MessageNotFoundError,
)

DEDUP_ENV = "FERRY_DEDUP"
DEFAULT_DEDUP = "127.0.0.1:10926"
#: A reconciliation reads a whole window from the brokers: give it time.
DEDUP_TIMEOUT_MS = 300_000
DEFAULT_SINCE = "1h"
_DURATION = re.compile(r"(\d+)(ms|s|m|h|d)")
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def duration_ms(text: str) -> int:
    """"90s", "15m", "1h", "2d", "500ms" -> milliseconds (argparse's type error otherwise)."""
    match = _DURATION.fullmatch(text.strip())
    if match is None:
        raise argparse.ArgumentTypeError(f"a duration such as 90s, 15m, 1h or 2d, not {text!r}")
    return int(match.group(1)) * _UNIT_MS[match.group(2)]


class DedupClient(HttpApi):
    """The dedup service's HTTP API, for the CLI. Use `async with DedupClient(addrs):`;
    `call(method, path, params=..., json=...)` answers its JSON (404 = not found)."""

    def __init__(self, addrs: str | None = None, *, timeout_ms: int = DEDUP_TIMEOUT_MS,
                 credentials: Credentials | None = None) -> None:
        """`credentials` sign the requests (default: FERRY_ACCESS_KEY / FERRY_SECRET_KEY)."""
        super().__init__(addrs or os.environ.get(DEDUP_ENV, DEFAULT_DEDUP), name="dedup",
                         timeout_ms=timeout_ms, credentials=credentials,
                         by_status={404: MessageNotFoundError})


def _print(data: Any) -> None:
    print(json.dumps(data, indent=2, sort_keys=True))


def _window(args: argparse.Namespace) -> tuple[int, int]:
    to_ms = args.to_ms if args.to_ms is not None else int(time.time() * 1000)
    if args.from_ms is not None:
        if args.since is not None:
            raise MalformedRequestError("give --since or --from-ms, not both")
        return args.from_ms, to_ms
    since_ms = args.since if args.since is not None else duration_ms(DEFAULT_SINCE)
    return to_ms - since_ms, to_ms


async def reconcile(args: argparse.Namespace) -> int:
    from_ms, to_ms = _window(args)
    body: dict[str, Any] = {"topic": args.topic, "group": args.group, "from_ms": from_ms,
                            "to_ms": to_ms}
    if args.scene:
        body["scene"] = args.scene
    if args.grace_ms is not None:
        body["grace_ms"] = args.grace_ms
    return await _show(args, "POST", "/v1/reconcile", json=body)


async def reports(args: argparse.Namespace) -> int:
    if args.id:
        return await _show(args, "GET", f"/v1/reports/{args.id}")
    return await _show(args, "GET", "/v1/reports", params={"limit": str(args.limit)})


async def lookup(args: argparse.Namespace) -> int:
    if args.msg_id:
        return await _show(args, "GET", f"/v1/ledger/messages/{args.msg_id}")
    if not (args.scene and args.biz_key):
        raise MalformedRequestError("lookup: give --msg-id, or --scene and --biz-key")
    return await _show(args, "GET", "/v1/ledger",
                       params={"scene": args.scene, "biz_key": args.biz_key})


async def _show(args: argparse.Namespace, method: str, path: str, *, json: Any = None,
                params: dict[str, str] | None = None) -> int:
    """Ask the dedup service (`--dedup`) and print its JSON answer."""
    async with DedupClient(args.dedup) as client:
        _print(await client.call(method, path, json=json, params=params))
    return 0


def add_dedup(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register `ferry dedup ...` on the `ferry` command's subparsers."""
    dedup = sub.add_parser("dedup", help="the dedup service: reconciliation reports and "
                                         "ledger look-ups")
    dsub = dedup.add_subparsers(dest="action", required=True, metavar="ACTION")
    addr = argparse.ArgumentParser(add_help=False)
    addr.add_argument("--dedup", default=os.environ.get(DEDUP_ENV, DEFAULT_DEDUP),
                      help=f"dedup service HTTP address(es) h:p[,h:p] (env {DEDUP_ENV}; "
                           f"default {DEFAULT_DEDUP})")
    rec = dsub.add_parser("reconcile", parents=[addr], help="compare a topic's stored "
                          "messages in a window with the ledger; print the report")
    rec.add_argument("--topic", required=True)
    rec.add_argument("--group", required=True)
    rec.add_argument("--scene", help="the ledger scene (default: the group)")
    rec.add_argument("--since", type=duration_ms, help=f"the window ends now (or --to-ms) and is this long: "
                                     f"90s, 15m, 1h, 2d (default {DEFAULT_SINCE})")
    rec.add_argument("--from-ms", type=int, help="window start, ms since the epoch")
    rec.add_argument("--to-ms", type=int, help="window end (exclusive), default now")
    rec.add_argument("--grace-ms", type=int, help="younger unrecorded messages are pending, "
                                                  "not missing (service default 60000)")
    rec.set_defaults(func=reconcile)
    rep = dsub.add_parser("reports", parents=[addr], help="kept reports, newest first "
                                                          "(or one whole report by --id)")
    rep.add_argument("--limit", type=int, default=20, help="at most N (1..100, default 20)")
    rep.add_argument("--id", help="one report, with its samples")
    rep.set_defaults(func=reports)
    look = dsub.add_parser("lookup", parents=[addr], help="ledger rows by business key or "
                                                          "message id")
    look.add_argument("--scene")
    look.add_argument("--biz-key")
    look.add_argument("--msg-id")
    look.set_defaults(func=lookup)
