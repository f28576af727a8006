"""Entry point: `python -m ferry_delay_scheduler` or `ferry-delay-scheduler`.

Configuration comes from FERRY_DELAY_SCHEDULER_* environment variables; a
flag given on the command line wins over the variable.
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import sys

from ferry.telemetry.logs import setup_logging

from ferry_delay_scheduler.config import SchedulerConfig

DESCRIPTION = (
    "Ferry delay scheduler: delayed and scheduled delivery and the back-off of consumer "
    "retries. It takes over the brokers' %SCHEDULE% topic into its own log store under "
    "DATA_DIR, keeps due times in a timing wheel (the next minute in memory, later minutes in "
    "bucket files), and re-sends each message to its real topic when due, never early. One "
    "instance, elected through etcd, pulls; every instance delivers what its own log holds. "
    "HTTP: /healthz, /readyz, /v1/stats, POST /v1/delayed/{msg_id}/cancel, /openapi.json. "
    "Configured by FERRY_DELAY_SCHEDULER_* environment variables; flags override them."
)

# flag -> (config field, type, help)
_FLAGS: list[tuple[str, str, type, str]] = [
    ("--host", "host", str, "HTTP listen address (FERRY_DELAY_SCHEDULER_HOST)"),
    ("--advertise-host", "advertise_host", str,
     "host published as the leader's address (FERRY_DELAY_SCHEDULER_ADVERTISE_HOST)"),
    ("--http-port", "http_port", int, "HTTP port, 0 = any free one "
     "(FERRY_DELAY_SCHEDULER_HTTP_PORT, 10922)"),
    ("--data-dir", "data_dir", str, "local log and wheel directory "
     "(FERRY_DELAY_SCHEDULER_DATA_DIR)"),
    ("--namesrv", "namesrv", str, "namesrv address(es) (FERRY_DELAY_SCHEDULER_NAMESRV)"),
    ("--etcd", "etcd", str, "etcd endpoints for the election, empty = always lead "
     "(FERRY_DELAY_SCHEDULER_ETCD)"),
    ("--etcd-prefix", "etcd_prefix", str, "etcd key prefix (FERRY_DELAY_SCHEDULER_ETCD_PREFIX)"),
    ("--instance-id", "instance_id", str, "this instance's id in the leader key "
     "(FERRY_DELAY_SCHEDULER_INSTANCE_ID)"),
    ("--log-level", "log_level", str, "DEBUG, INFO, WARNING, ERROR "
     "(FERRY_DELAY_SCHEDULER_LOG_LEVEL)"),
]


def parse_args(argv: list[str] | None) -> SchedulerConfig:
    parser = argparse.ArgumentParser(prog="ferry-delay-scheduler", description=DESCRIPTION)
    for flag, dest, typ, help_text in _FLAGS:
        parser.add_argument(flag, dest=dest, type=typ, default=None, help=help_text)
    args = parser.parse_args(argv)
    try:
        return SchedulerConfig.from_env(overrides=vars(args))
    except ValueError as exc:
        parser.error(str(exc))
        raise  # unreachable: parser.error exits


def main(argv: list[str] | None = None) -> int:
    config = parse_args(argv)
    setup_logging(config.log_level)
    from ferry_delay_scheduler.app import SchedulerApp  # after logging is set up

    try:
        asyncio.run(SchedulerApp(config).run())
    except Exception:
        logging.getLogger("ferry_delay_scheduler").exception("delay scheduler failed")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
