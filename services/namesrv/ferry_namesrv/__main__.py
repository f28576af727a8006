"""Entry point: `python -m ferry_namesrv` or `ferry-namesrv`."""
from __future__ import annotations

import sys

from ferry.service.startup import Entry, Flag, bool_value

from ferry_namesrv.config import NamesrvConfig

DESCRIPTION = (
    "Ferry name server. It owns what clients need to find messages: topic routes "
    "(which broker groups serve a topic, their master and slave addresses, queue counts), "
    "topic and group configuration, and broker liveness as clients see it. It keeps no "
    "state of its own: etcd is the truth, brokers register there under leases, and each "
    "instance watches etcd and answers over HTTP from its cache, so any number can run side "
    "by side. Configured by FERRY_NAMESRV_* environment variables; the flags below "
    "override them."
)


_FLAGS: list[Flag] = [
    ("--host", "host", str, "HTTP listen address (FERRY_NAMESRV_HOST, 127.0.0.1)"),
    ("--port", "port", int, "HTTP port, 0 = any free one (FERRY_NAMESRV_PORT, 9876)"),
    ("--etcd", "etcd", str, "etcd endpoints host:port[,host:port] "
     "(FERRY_NAMESRV_ETCD, 127.0.0.1:2379)"),
    ("--etcd-prefix", "etcd_prefix", str, "key prefix in etcd (FERRY_NAMESRV_ETCD_PREFIX, "
     "/ferry/)"),
    ("--auto-create-topics", "auto_create_topics", bool_value,
     "true or false: create unknown topics on GET /v1/routes/{topic}?create=1 "
     "(FERRY_NAMESRV_AUTO_CREATE_TOPICS, true)"),
    ("--default-queues", "default_queues", int, "queues of an auto-created topic "
     "(FERRY_NAMESRV_DEFAULT_QUEUES, 8)"),
    ("--console-url", "console_url", str, "where GET /console redirects "
     "(FERRY_NAMESRV_CONSOLE_URL, http://127.0.0.1:10927/console)"),
    ("--log-level", "log_level", str, "DEBUG, INFO, WARNING, ERROR (FERRY_NAMESRV_LOG_LEVEL, "
     "INFO)"),
]

ENTRY = Entry("ferry-namesrv", DESCRIPTION, _FLAGS, NamesrvConfig.from_env,
              "ferry_namesrv.app:NamesrvApp", "namesrv")
parse_args = ENTRY.parse
main = ENTRY.main


if __name__ == "__main__":
    sys.exit(main())
