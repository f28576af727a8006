"""Entry point: `python -m ferry_delay_scheduler` or `ferry-delay-scheduler`.

Configuration comes from FERRY_DELAY_SCHEDULER_* environment variables; a
flag given on the command line wins over the variable.
"""
from __future__ import annotations

import sys

from ferry.service.startup import Entry, Flag

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


ENTRY = Entry("ferry-delay-scheduler", DESCRIPTION, _FLAGS, SchedulerConfig.from_env,
              "ferry_delay_scheduler.app:SchedulerApp", "delay scheduler")
parse_args = ENTRY.parse
main = ENTRY.main


if __name__ == "__main__":
    sys.exit(main())
