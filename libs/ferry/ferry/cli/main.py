"""The `ferry` command: topics, sending, consuming, group lag, brokers, delays, dead letters,
transactions, identities and permissions.

Exit codes: 0 success, 1 a Ferry error (printed as `error: <Class>: message`;
also `dlq resend --id` when an id was not found; `txn describe` of an unknown id,
or the txn-checker unreachable), 2 bad usage (argparse),
3 `consume` ended by its timeout before --count messages arrived, 130
interrupted.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Sequence

from ferry.cli import brokers, commands
from ferry.cli import celery as celery_cli
from ferry.cli.auth import add_auth
from ferry.cli.dedup import add_dedup
from ferry.cli.groups import add_group_actions, add_topic_update
from ferry.cli.messages import add_messages
from ferry.client.core.namesrv import DEFAULT_NAMESRV
from ferry.client.producing.delay import DEFAULT_DELAY_SCHEDULER, DELAY_SCHEDULER_ENV
from ferry.client.transactions.txn_checker import DEFAULT_TXN_CHECKER, TXN_CHECKER_ENV
from ferry.errors import FerryError

EXIT_FERRY_ERROR = 1
EXIT_INTERRUPTED = 130


def _prop(value: str) -> tuple[str, str]:
    key, sep, val = value.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected k=v, got {value!r}")
    return key, val


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ferry", description="Administer and use a Ferry cluster through its namesrv.")
    parser.add_argument("--namesrv", default=os.environ.get("FERRY_NAMESRV", DEFAULT_NAMESRV),
                        help="namesrv address(es) h:p[,h:p] (env FERRY_NAMESRV; "
                             f"default {DEFAULT_NAMESRV})")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    topic = sub.add_parser("topic", help="create, list, describe, update or delete topics")
    tsub = topic.add_subparsers(dest="action", required=True, metavar="ACTION")
    create = tsub.add_parser("create", help="create a topic")
    create.add_argument("name")
    create.add_argument("--queues", type=int, default=8, help="queues per broker (default 8)")
    create.add_argument("--perm", default="rw", choices=["rw", "r", "w"])
    create.add_argument("--type", default="normal",
                        choices=["normal", "fifo", "delay", "transaction"],
                        help="what its SENDs may carry (default normal: anything); fifo: "
                             "keyed messages, delay: delayed ones, transaction: halves")
    create.add_argument("--broker", action="append", default=[], dest="brokers",
                        help="broker group to place it on (repeat; default every master)")
    create.add_argument("--priority-levels", type=int, default=1, metavar="L",
                        help="priority levels 1..4 (at most --queues; default 1): queue q of Q "
                             "serves level q*L//Q, consumers drain higher levels first")
    create.set_defaults(func=commands.topic_create)
    tsub.add_parser("list", help="list topics").set_defaults(func=commands.topic_list)
    describe = tsub.add_parser("describe", help="config, route and queue offsets of a topic")
    describe.add_argument("name")
    describe.set_defaults(func=commands.topic_describe)
    delete = tsub.add_parser("delete", help="delete a topic's config")
    delete.add_argument("name")
    delete.set_defaults(func=commands.config_delete)
    add_topic_update(tsub)

    send = sub.add_parser("send", help="send a message (or --count copies) and print results")
    send.add_argument("topic")
    send.add_argument("body")
    send.add_argument("--key", help="message key (also used for ordering with --ordered)")
    send.add_argument("--tags", help="message tag")
    send.add_argument("--prop", type=_prop, action="append", default=[], metavar="K=V",
                      help="user property (repeat)")
    send.add_argument("--count", type=int, default=1, help="send N copies (default 1)")
    send.add_argument("--ordered", action="store_true", help="hash --key to one queue")
    send.add_argument("--delay-ms", type=int, default=None, metavar="N",
                      help="deliver no earlier than N ms from now (1 ms .. 30 days; "
                           "cancel with `ferry delay cancel ID`)")
    send.add_argument("--ttl-ms", type=int, default=None, metavar="N",
                      help="never deliver once N ms have passed since it was stored in the topic")
    send.add_argument("--priority", type=int, default=0, choices=range(4), metavar="P",
                      help="0..3, 3 highest (default 0), on a topic with priority levels")
    send.add_argument("--trace", action="store_true",
                      help="trace this message whatever the sampling (see its hops with "
                           "`ferry message get ID` or the console)")
    send.set_defaults(func=commands.send)

    consume = sub.add_parser("consume", help="consume and print messages with their offsets")
    consume.add_argument("topic")
    consume.add_argument("--group", required=True)
    consume.add_argument("--from", dest="from_", default=None, choices=["earliest", "latest"],
                         help="where a group with no committed offset starts (default: the "
                              "group's consume_from in namesrv, else latest)")
    consume.add_argument("--count", type=int, default=0, help="exit after N messages")
    consume.add_argument("--timeout-ms", type=int, default=0,
                         help="exit after this long without reaching --count (0 = never)")
    which = consume.add_mutually_exclusive_group()
    which.add_argument("--tags", help="tag filter, e.g. 'a||b'")
    which.add_argument("--sql", help="SQL92 filter on properties, TAGS and KEYS, e.g. "
                                     "\"amount > 100 AND region IN ('eu', 'us')\"")
    consume.add_argument("--broadcast", action="store_true", help="broadcasting mode")
    consume.set_defaults(func=commands.consume)

    group = sub.add_parser("group", help="consumer group tools")
    gsub = group.add_subparsers(dest="action", required=True, metavar="ACTION")
    lag = gsub.add_parser("lag", help="per-queue committed offset, max offset and lag")
    lag.add_argument("group")
    lag.add_argument("--topic", action="append", dest="topics",
                     help="topic to check (repeat; default every topic the group committed on)")
    lag.set_defaults(func=commands.group_lag)
    gsub.add_parser("list", help="list group configs").set_defaults(func=commands.group_list)
    add_group_actions(gsub)
    _add_broker(sub)
    _add_delay(sub)
    _add_dlq(sub)
    _add_txn(sub)
    add_dedup(sub)
    add_messages(sub)
    add_auth(sub)
    celery_cli.add_parser(sub)
    return parser


def _add_broker(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    broker = sub.add_parser("broker", help="broker groups")
    bsub = broker.add_subparsers(dest="action", required=True, metavar="ACTION")
    listing = bsub.add_parser("list", help="groups, members, roles, epochs and replication lag")
    listing.add_argument("--json", action="store_true", help="print JSON rows instead")
    listing.set_defaults(func=brokers.broker_list)


def _add_delay(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    delay = sub.add_parser("delay", help="delayed messages")
    dsub = delay.add_subparsers(dest="action", required=True, metavar="ACTION")
    cancel = dsub.add_parser("cancel", help="cancel a delayed message before it is due "
                                            "(an error says so if it was delivered already)")
    cancel.add_argument("id", help="its message id (32 hex characters, as `send` printed)")
    cancel.add_argument("--scheduler",
                        default=os.environ.get(DELAY_SCHEDULER_ENV, DEFAULT_DELAY_SCHEDULER),
                        help=f"delay scheduler HTTP address(es) h:p[,h:p] (env "
                             f"{DELAY_SCHEDULER_ENV}; default {DEFAULT_DELAY_SCHEDULER})")
    cancel.set_defaults(func=commands.delay_cancel)


def _add_dlq(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    dlq = sub.add_parser("dlq", help="a group's dead-letter queue (%%DLQ%%GROUP)")
    qsub = dlq.add_subparsers(dest="action", required=True, metavar="ACTION")
    listing = qsub.add_parser("list", help="messages after the group's DLQ offset (what "
                                           "purge and resend --all have not passed)")
    listing.add_argument("group")
    listing.add_argument("--limit", type=int, default=1000, help="at most N (default 1000)")
    listing.set_defaults(func=commands.dlq_list)
    resend = qsub.add_parser("resend", help="send dead letters back to the group only "
                                            "(through its retry topic, attempts from 0)")
    resend.add_argument("group")
    which = resend.add_mutually_exclusive_group(required=True)
    which.add_argument("--id", action="append", dest="ids", metavar="ID",
                       help="message id to resend (repeat)")
    which.add_argument("--all", action="store_true",
                       help="resend every listed message, then move the DLQ offset past them")
    resend.set_defaults(func=commands.dlq_resend)
    purge = qsub.add_parser("purge", help="move the group's DLQ offset to the end: nothing is "
                                          "listed any more (a log cannot delete messages)")
    purge.add_argument("group")
    purge.set_defaults(func=commands.dlq_purge)


def _add_txn(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    txn = sub.add_parser("txn", help="transactions the txn-checker tracks")
    xsub = txn.add_subparsers(dest="action", required=True, metavar="ACTION")
    addr = argparse.ArgumentParser(add_help=False)
    addr.add_argument("--txn-checker", default=os.environ.get(TXN_CHECKER_ENV, DEFAULT_TXN_CHECKER),
                      help=f"txn-checker HTTP address(es) h:p[,h:p] (env {TXN_CHECKER_ENV}; "
                           f"default {DEFAULT_TXN_CHECKER})")
    listing = xsub.add_parser("list", parents=[addr],
                              help="open transactions (half messages with no commit or "
                                   "rollback yet), or --discarded ones")
    listing.add_argument("--discarded", action="store_true",
                         help="those rolled back after the check limit instead (newest first)")
    listing.add_argument("--limit", type=int, default=100, help="at most N (1..1000, default 100)")
    listing.set_defaults(func=commands.txn_list)
    describe = xsub.add_parser("describe", parents=[addr], help="one transaction by id")
    describe.add_argument("id", help="the transaction id (its half message's id, 32 hex)")
    describe.set_defaults(func=commands.txn_describe)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return asyncio.run(args.func(args))
    except FerryError as exc:
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_FERRY_ERROR
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_FERRY_ERROR
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
