"""Entry point: `python -m ferry_delay_scheduler` or `ferry-delay-scheduler`.

Configuration comes from FERRY_DELAY_SCHEDULER_* environment variables; a
flag given on the command line wins over the variable.
"""
from __future__ import annotations

import sys

from ferry.entry import Flag, parse_config, run_app

from ferry_delay_scheduler.config import SchedulerConfig

DESCRIPTION = (
    "Ferry delay scheduler: delayed and scheduled delivery and the back-off of consumer "
    "retries. The leader, elected through etcd, reads the brokers' %SCHEDULE% topic into a "
    "cache under DATA_DIR, keeps due times in a timing wheel (the next minute in memory, later "
    "minutes in bucket files), and re-sends each message to its real topic when due, never "
    "early; it commits %SCHEDULE% offsets only past what it delivered, so the loss of its "
    "machine loses nothing: a standby takes over. "
    "HTTP: /healthz, /readyz, /v1/stats, POST /v1/delayed/{msg_id}/cancel, /openapi.json. "
    "Configured by FERRY_DELAY_SCHEDULER_* environment variables; flags override them."
)

_FLAGS: list[Flag] = [
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
    return parse_config(argv, "ferry-delay-scheduler", DESCRIPTION, _FLAGS, SchedulerConfig.from_env)


def main(argv: list[str] | None = None) -> int:
    config = parse_args(argv)

    async def run() -> None:
        from ferry_delay_scheduler.app import SchedulerApp  # after logging is set up
        await SchedulerApp(config).run()

    return run_app(config.log_level, run, "ferry_delay_scheduler", "delay scheduler")


if __name__ == "__main__":
    sys.exit(main())
