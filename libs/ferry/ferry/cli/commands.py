"""What each `ferry` sub-command does; `main` parses arguments and maps errors to exit codes."""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from typing import Any

from ferry.client import Admin, Consumer, Producer, Sql
from ferry.client.producing.delay import DelaySchedulerClient
from ferry.client.transactions.txn_checker import TxnCheckerClient
from ferry.codec import ORIGIN_TOPIC

EXIT_TIMEOUT = 3


def _print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, sort_keys=True))


async def topic_create(args: argparse.Namespace) -> int:
    async with Admin(namesrv=args.namesrv) as admin:
        cfg = await admin.create_topic(args.name, queues=args.queues, perm=args.perm,
                                       type=args.type, brokers=args.brokers,
                                       priority_levels=args.priority_levels)
    _print_json(cfg)
    return 0


async def topic_list(args: argparse.Namespace) -> int:
    async with Admin(namesrv=args.namesrv) as admin:
        topics = await admin.list_topics()
    for t in topics:
        print(f"{t['name']}\tqueues={t.get('queues')}\tperm={t.get('perm')}\ttype={t.get('type')}")
    return 0


async def topic_describe(args: argparse.Namespace) -> int:
    async with Admin(namesrv=args.namesrv) as admin:
        _print_json(await admin.describe_topic(args.name))
    return 0


async def config_delete(args: argparse.Namespace) -> int:
    """`ferry topic delete` and `ferry group delete`: the config in namesrv (a group's
    committed offsets stay at the brokers)."""
    async with Admin(namesrv=args.namesrv) as admin:
        if args.command == "group":
            await admin.delete_group(args.name)
        else:
            await admin.delete_topic(args.name)
    print(f"deleted {args.name}")
    return 0


async def group_list(args: argparse.Namespace) -> int:
    async with Admin(namesrv=args.namesrv) as admin:
        for g in await admin.list_groups():
            print(g["name"])
    return 0


async def group_lag(args: argparse.Namespace) -> int:
    async with Admin(namesrv=args.namesrv) as admin:
        lags = await admin.group_lag(args.group, args.topics)
    total = 0
    print("topic\tbroker\tqueue\tcommitted\tmax\tlag")
    for q in lags:
        total += q.lag
        print(f"{q.tq.topic}\t{q.tq.broker}\t{q.tq.queue_id}\t{q.committed}\t{q.max_offset}\t{q.lag}")
    print(f"total lag: {total}")
    return 0


async def send(args: argparse.Namespace) -> int:
    if args.count < 1:
        raise ValueError("--count must be at least 1")
    props = dict(args.prop)
    async with Producer(namesrv=args.namesrv) as producer:
        futs = [await producer.send(args.topic, args.body.encode(), key=args.key, tags=args.tags,
                                    properties=props, ordered=args.ordered,
                                    delay_ms=args.delay_ms, ttl_ms=args.ttl_ms,
                                    priority=args.priority, trace=args.trace or None)
                for _ in range(args.count)]
        results = await asyncio.gather(*futs)
    for r in results:
        where = "delayed" if r.queue_offset < 0 and args.delay_ms else f"offset {r.queue_offset}"
        print(f"sent {r.msg_id} to {r.topic}@{r.broker}#{r.queue_id} {where}")
    return 0


async def delay_cancel(args: argparse.Namespace) -> int:
    client = DelaySchedulerClient(args.scheduler)
    try:
        await client.cancel(args.id)
    finally:
        await client.close()
    print(f"cancelled {args.id.upper()}: it will not be delivered")
    return 0


async def dlq_list(args: argparse.Namespace) -> int:
    async with Admin(namesrv=args.namesrv) as admin:
        records = await admin.dead_letters(args.group).messages(limit=args.limit)
    for rec in records:
        body = rec.body[:200].decode("utf-8", errors="replace")
        print(f"{rec.msg_id}\ttopic={rec.properties.get(ORIGIN_TOPIC, '')}\t"
              f"reconsume_times={rec.reconsume_times}\t{rec.broker}#{rec.queue_id} "
              f"offset={rec.queue_offset}\tkey={rec.key or ''}\ttags={rec.tags or ''}\t{body}")
    print(f"total: {len(records)}")
    return 0


async def dlq_resend(args: argparse.Namespace) -> int:
    async with Admin(namesrv=args.namesrv) as admin:
        sent = await admin.dead_letters(args.group).resend(None if args.all else args.ids)
    for msg_id in sent:
        print(f"resent {msg_id} to group {args.group}")
    missing = set() if args.all else {i.upper() for i in args.ids} - set(sent)
    for msg_id in sorted(missing):
        print(f"not found after the group's DLQ offset: {msg_id}", file=sys.stderr)
    print(f"total: {len(sent)}")
    return 1 if missing else 0


async def dlq_purge(args: argparse.Namespace) -> int:
    async with Admin(namesrv=args.namesrv) as admin:
        skipped = await admin.dead_letters(args.group).purge()
    print(f"purged {skipped} message(s) from the DLQ of {args.group} "
          "(the group's DLQ offset moved to the end)")
    return 0


async def consume(args: argparse.Namespace) -> int:
    mode = "broadcasting" if args.broadcast else "clustering"
    deadline = time.monotonic() + args.timeout_ms / 1000 if args.timeout_ms > 0 else None
    seen = 0
    async with Consumer(args.topic, group=args.group, namesrv=args.namesrv, mode=mode,
                        auto_offset_reset=args.from_,
                        subscription=Sql(args.sql) if args.sql else args.tags) as consumer:
        while args.count <= 0 or seen < args.count:
            wait_ms = 1000
            if deadline is not None:
                wait_ms = int((deadline - time.monotonic()) * 1000)
                if wait_ms <= 0:
                    break
            batch = await consumer.getmany(timeout_ms=min(wait_ms, 1000),
                                           max_records=(args.count - seen) if args.count else None)
            for records in batch.values():
                for rec in records:
                    seen += 1
                    body = rec.body.decode("utf-8", errors="replace")
                    print(f"{rec.topic}@{rec.broker}#{rec.queue_id} offset={rec.queue_offset} "
                          f"id={rec.msg_id} key={rec.key or ''} tags={rec.tags or ''}\t{body}",
                          flush=True)
        await consumer.commit()
    if args.count > 0 and seen < args.count:
        return EXIT_TIMEOUT
    return 0


#: The fields of a transaction `ferry txn list` shows first, in this order (others follow).
_TXN_COLUMNS = ("msg_id", "group", "topic", "broker", "state", "checks", "store_ms",
                "next_check_ms")


def _txn_line(txn: dict[str, Any]) -> str:
    first = [f"{k}={txn[k]}" for k in _TXN_COLUMNS[1:] if k in txn]
    rest = [f"{k}={v}" for k, v in sorted(txn.items()) if k not in _TXN_COLUMNS
            and not isinstance(v, dict | list)]
    return "\t".join([str(txn.get("msg_id", "?")), *first, *rest])


async def txn_list(args: argparse.Namespace) -> int:
    state = "discarded" if args.discarded else "open"
    async with TxnCheckerClient(args.txn_checker) as client:
        txns, total = await client.list(state, args.limit)
    for txn in txns:
        print(_txn_line(txn))
    shown = f" (showing {len(txns)})" if len(txns) < total else ""
    print(f"total: {total} {state}{shown}")
    return 0


async def txn_describe(args: argparse.Namespace) -> int:
    async with TxnCheckerClient(args.txn_checker) as client:
        _print_json(await client.describe(args.id))
    return 0
