"""`ferry message get | key | time`: find stored messages by id, by key, by store time.

    ferry message get ID                         one message by id, on every broker (any topic)
    ferry message key TOPIC KEY [--limit N]      messages of TOPIC with KEY, newest first
    ferry message time TOPIC --from T [--to T]   messages of TOPIC stored in [from, to)

T is milliseconds since the epoch, an ISO 8601 time (UTC unless it names its
zone), or a duration ago such as 90s, 15m, 2h. Each message is printed as one
JSON object per line (body as text when it is UTF-8, else base64; `--body-bytes`
bounds it), then `total: N`. Exit status 1 when `get` finds nothing, or a
Ferry error; a broker that could not be asked is named on stderr.
"""
from __future__ import annotations

import argparse
import base64
import datetime as dt
import json
import re
import sys
import time
from typing import Any

from ferry.client.admin.admin import Admin
from ferry.client.admin.query import MAX_KEY_COUNT, MAX_TIME_COUNT, QueryResult
from ferry.client.core.message import ConsumerRecord
from ferry.errors import MessageNotFoundError

DEFAULT_BODY_BYTES = 1024
_AGO = re.compile(r"(\d+)(ms|s|m|h|d)")
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def parse_time_ms(text: str, now_ms: int | None = None) -> int:
    """Epoch ms, ISO 8601 (UTC by default) or a duration ago -> epoch ms (argparse error else)."""
    text = text.strip()
    if text.isdigit():
        return int(text)
    now = int(time.time() * 1000) if now_ms is None else now_ms
    match = _AGO.fullmatch(text)
    if match is not None:
        return now - int(match.group(1)) * _UNIT_MS[match.group(2)]
    try:
        when = dt.datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"a time is epoch ms, ISO 8601 or a duration ago (15m), not {text!r}") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return int(when.timestamp() * 1000)


def record_json(rec: ConsumerRecord, body_bytes: int = DEFAULT_BODY_BYTES) -> dict[str, Any]:
    """One stored message as JSON: where it is, its metadata and (a preview of) its body."""
    body = rec.body[:body_bytes]
    try:
        text, encoding = body.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        text, encoding = base64.b64encode(body).decode("ascii"), "base64"
    return {"msg_id": rec.msg_id, "topic": rec.stored_topic, "broker": rec.broker,
            "queue_id": rec.queue_id, "queue_offset": rec.queue_offset,
            "born_ts_ms": rec.born_ts_ms, "store_ts_ms": rec.store_ts_ms,
            "reconsume_times": rec.reconsume_times, "tags": rec.tags, "keys": list(rec.keys),
            "properties": dict(rec.properties), "body_size": len(rec.body),
            "body": text, "body_encoding": encoding,
            "body_truncated": len(rec.body) > body_bytes}


def _print(found: QueryResult, body_bytes: int) -> None:
    for rec in found:
        print(json.dumps(record_json(rec, body_bytes), sort_keys=True))
    for err in found.errors:
        print(f"warning: not asked: {err}", file=sys.stderr)
    if found.truncated:
        print("warning: more messages match; narrow the query", file=sys.stderr)
    print(f"total: {len(found)}")


async def message_get(args: argparse.Namespace) -> int:
    async with Admin(namesrv=args.namesrv) as admin:
        found = await admin.query_message(args.id)
    if not found:
        if found.errors:
            _print(found, args.body_bytes)
        raise MessageNotFoundError(f"no broker stores a message with id {args.id.upper()}")
    _print(found, args.body_bytes)
    return 0


async def message_key(args: argparse.Namespace) -> int:
    async with Admin(namesrv=args.namesrv) as admin:
        found = await admin.query_by_key(args.topic, args.key, max_count=args.limit)
    _print(found, args.body_bytes)
    return 0


async def message_time(args: argparse.Namespace) -> int:
    to_ms = args.to_ms if args.to_ms is not None else int(time.time() * 1000)
    async with Admin(namesrv=args.namesrv) as admin:
        found = await admin.messages_by_time(args.topic, args.from_ms, to_ms,
                                             max_count=args.limit)
    _print(found, args.body_bytes)
    return 0


def add_messages(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register `ferry message ...` on the `ferry` command's subparsers."""
    message = sub.add_parser("message", help="find stored messages by id, key or store time")
    msub = message.add_subparsers(dest="action", required=True, metavar="ACTION")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--body-bytes", type=int, default=DEFAULT_BODY_BYTES, metavar="N",
                        help=f"print at most N bytes of each body (default {DEFAULT_BODY_BYTES})")
    get = msub.add_parser("get", parents=[common], help="one message by id from every broker "
                          "(in any topic, internal ones too)")
    get.add_argument("id", help="the message id (32 hex characters)")
    get.set_defaults(func=message_get)
    key = msub.add_parser("key", parents=[common], help="messages of a topic with a key "
                          "(the brokers' key index), newest first")
    key.add_argument("topic")
    key.add_argument("key")
    key.add_argument("--limit", type=int, default=MAX_KEY_COUNT,
                     help=f"at most N (1..{MAX_KEY_COUNT}, default {MAX_KEY_COUNT})")
    key.set_defaults(func=message_key)
    window = msub.add_parser("time", parents=[common], help="messages of a topic stored in "
                             "[--from, --to), oldest first")
    window.add_argument("topic")
    window.add_argument("--from", dest="from_ms", type=parse_time_ms, required=True,
                        metavar="T", help="window start: epoch ms, ISO 8601, or ago (15m)")
    window.add_argument("--to", dest="to_ms", type=parse_time_ms, default=None, metavar="T",
                        help="window end, exclusive (default now)")
    window.add_argument("--limit", type=int, default=100,
                        help=f"at most N (1..{MAX_TIME_COUNT}, default 100)")
    window.set_defaults(func=message_time)
