"""`python -m ferry_namesrv` or `ferry-namesrv`: flags over the FERRY_NAMESRV_* variables."""
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
    "host", ("port", int, "HTTP port, 0 = any free one"), "etcd", "etcd_prefix",
    ("auto_create_topics", bool_value,
     "true or false: create unknown topics on GET /v1/routes/{topic}?create=1"),
    ("default_queues", int, "queues of an auto-created topic"),
    ("console_url", str, "where GET /console redirects"), "log_level",
]
main = Entry("ferry-namesrv", DESCRIPTION, _FLAGS, NamesrvConfig.from_env,
             "ferry_namesrv.app:NamesrvApp", "namesrv").main


if __name__ == "__main__":
    sys.exit(main())
