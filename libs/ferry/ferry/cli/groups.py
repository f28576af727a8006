"""`ferry group create|describe|delete|reset-offsets` and `ferry topic update`."""
from __future__ import annotations

import argparse
import sys
from typing import Any

from ferry.cli.commands import _print_json, config_delete
from ferry.client import Admin
from ferry.client.admin.offset_reset import ResetPlan, ResetSpec, ResetTo, parse_time_ms

SubParsers = argparse._SubParsersAction  # type: ignore[type-arg]


def add_group_actions(gsub: SubParsers) -> None:
    """The group sub-commands beyond `lag` and `list`."""
    create = gsub.add_parser("create", help="create a group's config in namesrv")
    create.add_argument("name")
    create.add_argument("--retry-max", type=int, default=None, metavar="N",
                        help="redeliveries before the dead-letter queue (default 16)")
    create.add_argument("--consume-from", default=None,
                        choices=["latest", "earliest", "timestamp"],
                        help="where the group starts with no committed offset (default latest)")
    create.add_argument("--consume-timestamp-ms", type=int, default=None, metavar="MS",
                        help="with --consume-from timestamp: start at messages stored from MS")
    create.add_argument("--no-broadcast", action="store_true",
                        help="refuse broadcasting consumers in this group")
    create.set_defaults(func=group_create)
    describe = gsub.add_parser("describe", help="a group's config, live members and lag")
    describe.add_argument("name")
    describe.add_argument("--topic", action="append", dest="topics",
                          help="topic whose lag and members to show (repeat; default every "
                               "topic the group committed on)")
    describe.set_defaults(func=group_describe)
    delete = gsub.add_parser("delete", help="delete a group's config (committed offsets stay)")
    delete.add_argument("name")
    delete.set_defaults(func=config_delete)
    reset = gsub.add_parser(
        "reset-offsets", help="move a group's committed offsets on a topic (refused while "
                              "the group has live members, unless --force)")
    reset.add_argument("group")
    reset.add_argument("--topic", required=True)
    to = reset.add_mutually_exclusive_group(required=True)
    to.add_argument("--to-earliest", action="store_true", help="the oldest kept message")
    to.add_argument("--to-latest", action="store_true", help="the end: only new messages")
    to.add_argument("--to-time", metavar="ISO-OR-MS",
                    help="the first message stored at or after this time (ISO 8601, UTC "
                         "when no zone is given, or milliseconds since the epoch)")
    to.add_argument("--to-offset", type=int, metavar="N", help="queue offset N on every queue")
    to.add_argument("--shift-by", type=int, metavar="N",
                    help="the committed offset moved by N (negative: back)")
    reset.add_argument("--dry-run", action="store_true",
                       help="print the plan per queue and change nothing")
    reset.add_argument("--force", action="store_true",
                       help="reset although members are live (they move to the new offsets)")
    reset.set_defaults(func=group_reset_offsets)


def add_topic_update(tsub: SubParsers) -> None:
    update = tsub.add_parser("update", help="change a topic's queues, perm or retention")
    update.add_argument("name")
    update.add_argument("--queues", type=int, default=None, help="queues per broker")
    update.add_argument("--perm", default=None, choices=["rw", "r", "w"])
    update.add_argument("--retention-ms", type=int, default=None, metavar="MS",
                        help="keep this topic's messages this long (default: the broker's)")
    update.add_argument("--retention-bytes", type=int, default=None, metavar="B",
                        help="keep at most this many bytes of the topic per queue")
    update.set_defaults(func=topic_update)


def spec_of(args: argparse.Namespace) -> ResetSpec:
    if args.to_earliest:
        return ResetSpec(ResetTo.EARLIEST)
    if args.to_latest:
        return ResetSpec(ResetTo.LATEST)
    if args.to_time is not None:
        return ResetSpec(ResetTo.TIME, parse_time_ms(args.to_time))
    if args.to_offset is not None:
        return ResetSpec(ResetTo.OFFSET, args.to_offset)
    return ResetSpec(ResetTo.SHIFT, args.shift_by)


async def group_create(args: argparse.Namespace) -> int:
    config: dict[str, Any] = {"retry_max": args.retry_max, "consume_from": args.consume_from,
                              "consume_timestamp_ms": args.consume_timestamp_ms}
    if args.no_broadcast:
        config["broadcast_allowed"] = False
    async with Admin(namesrv=args.namesrv) as admin:
        _print_json(await admin.create_group(
            args.name, **{k: v for k, v in config.items() if v is not None}))
    return 0


async def group_describe(args: argparse.Namespace) -> int:
    async with Admin(namesrv=args.namesrv) as admin:
        config = await admin.describe_group(args.name)
        lags = await admin.group_lag(args.name, args.topics)
        members = {t: await admin.group_members(args.name, t)
                   for t in sorted({q.tq.topic for q in lags})}
        resets = await admin.offset_resets(args.name)
    _print_json({"config": config, "members": members, "resets": resets,
                 "queues": [{"topic": q.tq.topic, "broker": q.tq.broker,
                             "queue_id": q.tq.queue_id, "committed": q.committed,
                             "max_offset": q.max_offset, "lag": q.lag} for q in lags]})
    return 0


def print_plan(plan: ResetPlan) -> None:
    print("topic\tbroker\tqueue\tfrom\tto")
    for q in plan.queues:
        print(f"{plan.topic}\t{q.broker}\t{q.queue_id}\t{q.before}\t{q.after}")
    if plan.members:
        print(f"live members: {', '.join(plan.members)}")
    if plan.executed:
        print(f"reset {plan.group} on {plan.topic}: {len(plan.queues)} queue(s)")
        if plan.unrecorded:
            print(f"warning: the reset is not in namesrv's record: {plan.unrecorded}",
                  file=sys.stderr)
    else:
        print("dry run: nothing changed")


async def group_reset_offsets(args: argparse.Namespace) -> int:
    async with Admin(namesrv=args.namesrv) as admin:
        plan = await admin.reset_offsets(args.group, args.topic, spec_of(args),
                                         dry_run=args.dry_run, force=args.force)
    print_plan(plan)
    return 0


async def topic_update(args: argparse.Namespace) -> int:
    async with Admin(namesrv=args.namesrv) as admin:
        given = {"queues": args.queues, "perm": args.perm, "retention_ms": args.retention_ms,
                 "retention_bytes": args.retention_bytes}
        # only the options given change (None would set a retention back to the broker's)
        _print_json(await admin.update_topic(
            args.name, **{k: v for k, v in given.items() if v is not None}))
    return 0
