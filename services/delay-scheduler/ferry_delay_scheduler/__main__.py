"""`python -m ferry_delay_scheduler` or `ferry-delay-scheduler`: flags over the
FERRY_DELAY_SCHEDULER_* variables."""
from __future__ import annotations

import sys

from ferry.service.startup import Entry, Flag

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
    "host", ("advertise_host", str, "host published as the leader's address"), "http_port",
    ("data_dir", str, "local log and wheel directory"), "namesrv",
    ("etcd", str, "etcd endpoints for the election, empty = always lead"), "etcd_prefix",
    ("instance_id", str, "this instance's id in the leader key"), "log_level",
]
ENTRY = Entry("ferry-delay-scheduler", DESCRIPTION, _FLAGS, SchedulerConfig.from_env,
              "ferry_delay_scheduler.app:SchedulerApp", "delay scheduler")
parse_args, main = ENTRY.parse, ENTRY.main


if __name__ == "__main__":
    sys.exit(main())
