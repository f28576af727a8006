"""`python -m ferry_console` or `ferry-console`: flags over the FERRY_CONSOLE_* variables."""
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
    "host", "http_port", "log_level", "namesrv",
    ("delay_scheduler", str, "delay scheduler HTTP address(es), empty = none"),
    ("txn_checker", str, "txn-checker HTTP address(es), empty = none"),
    ("dedup", str, "dedup HTTP address(es), empty = none")]
main = Entry("ferry-console", DESCRIPTION, _FLAGS, ConsoleConfig.from_env,
             "ferry_console.app:ConsoleApp", "console").main


if __name__ == "__main__":
    sys.exit(main())
