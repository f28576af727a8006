"""`python -m ferry_broker` or `ferry-broker`: flags over the FERRY_BROKER_* variables."""
from __future__ import annotations

import logging
import resource
import sys

from ferry.service.startup import Entry, Flag

from ferry_broker.config import BrokerConfig

DESCRIPTION = (
    "Ferry broker: stores and serves messages on its log store directory. It owns the "
    "commit log and consume queues under DATA_DIR, SEND (acknowledged after the write, or "
    "after fsync in sync flush mode), PULL with long polling and tag filtering, consumer "
    "offsets (DATA_DIR/config/consumer_offsets.json), message query by id, key and time, "
    "and the live consumers of each group. It registers itself in etcd under a lease with "
    "the topics it serves. Configured by FERRY_BROKER_* environment variables; flags override them."
)

_FLAGS: list[Flag] = [
    ("cluster", str, "cluster name"), ("name", str, "broker group name"),
    ("id", int, "broker id; without replication 0 = master"), "host",
    ("advertise_host", str, "host registered for clients, empty = --host"),
    ("port", int, "wire protocol port"), ("http_port", int, "HTTP API port, 0 = none"),
    ("data_dir", str, "log store directory"),
    ("etcd", str, "etcd endpoints host:port[,host:port], empty = no etcd"), "etcd_prefix",
    ("lease_ttl_s", int, "etcd lease TTL in seconds"), ("flush_mode", str, "async or sync"),
    ("default_queues", int, "queues of an auto-created topic"),
    ("segment_bytes", int, "commit log segment size"),
    ("replication", str, "none, async or sync: elect the group's master in etcd and "
     "replicate to its slaves"),
    ("repl_port", int, "replication port"), "log_level",
    ("namesrv", str, "namesrv address(es) for the trace topic exporter, empty = none"),
    ("auto_create_topics", bool, "create unknown topics on first SEND"),
]


def raise_fd_limit() -> int:
    """Raise the soft open-files limit to the hard one; the new soft limit.

    The store sizes its budget of mapped consume-queue segments from this
    limit, and each client connection takes a descriptor too.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            return target
        except (ValueError, OSError):
            pass
    return soft


def _log_fd_limit() -> None:
    logging.getLogger("ferry_broker").info("open-files limit %d", raise_fd_limit())


ENTRY = Entry("ferry-broker", DESCRIPTION, _FLAGS, BrokerConfig.from_env,
              "ferry_broker.app:BrokerApp", "broker", uvloop=True, prepare=_log_fd_limit)
parse_args, main = ENTRY.parse, ENTRY.main


if __name__ == "__main__":
    sys.exit(main())
