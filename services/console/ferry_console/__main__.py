"""Entry point: `python -m ferry_console` or `ferry-console`.

Configuration comes from FERRY_CONSOLE_* environment variables; a flag given
on the command line wins over the variable.
"""
from __future__ import annotations

import sys

from ferry.service.startup import Entry, Flag

from ferry_console.config import ConsoleConfig

DESCRIPTION = (
    "Ferry console: server-rendered pages under /console for the cluster (brokers, roles, "
    "health, disk), topics (queues, offsets, rates), groups (members, per-queue lag, "
    "subscriptions), message search by id, key or time with each message's trace, a group's "
    "dead letters with resend, and the schedulers' and checkers' statistics. It reads "
    "namesrv, the brokers and the services over the network and keeps no state. "
    "Configured by FERRY_CONSOLE_* environment variables; flags override them."
)

_FLAGS: list[Flag] = [
    ("--host", "host", str, "HTTP listen address (FERRY_CONSOLE_HOST)"),
    ("--http-port", "http_port", int, "HTTP port, 0 = any free one "
     "(FERRY_CONSOLE_HTTP_PORT, 10927)"),
    ("--namesrv", "namesrv", str, "namesrv address(es) (FERRY_CONSOLE_NAMESRV)"),
    ("--delay-scheduler", "delay_scheduler", str,
     "delay scheduler HTTP address(es), empty = none (FERRY_CONSOLE_DELAY_SCHEDULER)"),
    ("--txn-checker", "txn_checker", str,
     "txn-checker HTTP address(es), empty = none (FERRY_CONSOLE_TXN_CHECKER)"),
    ("--dedup", "dedup", str, "dedup HTTP address(es), empty = none (FERRY_CONSOLE_DEDUP)"),
    ("--log-level", "log_level", str, "DEBUG, INFO, WARNING, ERROR (FERRY_CONSOLE_LOG_LEVEL)"),
]


ENTRY = Entry("ferry-console", DESCRIPTION, _FLAGS, ConsoleConfig.from_env,
              "ferry_console.app:ConsoleApp", "console")
parse_args = ENTRY.parse
main = ENTRY.main


if __name__ == "__main__":
    sys.exit(main())
