"""Entry point: `python -m ferry_broker` or `ferry-broker`.

Configuration comes from FERRY_BROKER_* environment variables; a flag given
on the command line wins over the variable.
"""
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
    ("--cluster", "cluster", str, "cluster name (FERRY_BROKER_CLUSTER)"),
    ("--name", "name", str, "broker group name (FERRY_BROKER_NAME)"),
    ("--id", "id", int, "broker id; without replication 0 = master (FERRY_BROKER_ID)"),
    ("--host", "host", str, "address to bind (FERRY_BROKER_HOST)"),
    ("--advertise-host", "advertise_host", str, "host registered for clients "
     "(FERRY_BROKER_ADVERTISE_HOST, default: --host)"),
    ("--port", "port", int, "wire protocol port (FERRY_BROKER_PORT)"),
    ("--http-port", "http_port", int, "HTTP API port, 0 = none (FERRY_BROKER_HTTP_PORT)"),
    ("--data-dir", "data_dir", str, "log store directory (FERRY_BROKER_DATA_DIR)"),
    ("--etcd", "etcd", str, "etcd endpoints host:port[,host:port], empty = no etcd "
     "(FERRY_BROKER_ETCD)"),
    ("--etcd-prefix", "etcd_prefix", str, "etcd key prefix (FERRY_BROKER_ETCD_PREFIX)"),
    ("--lease-ttl-s", "lease_ttl_s", int, "etcd lease TTL in seconds (FERRY_BROKER_LEASE_TTL_S)"),
    ("--flush-mode", "flush_mode", str, "async or sync (FERRY_BROKER_FLUSH_MODE)"),
    ("--default-queues", "default_queues", int, "queues of an auto-created topic "
     "(FERRY_BROKER_DEFAULT_QUEUES)"),
    ("--segment-bytes", "segment_bytes", int, "commit log segment size "
     "(FERRY_BROKER_SEGMENT_BYTES)"),
    ("--replication", "replication", str, "none, async or sync: elect the group's master "
     "in etcd and replicate to its slaves (FERRY_BROKER_REPLICATION)"),
    ("--repl-port", "repl_port", int, "replication port (FERRY_BROKER_REPL_PORT)"),
    ("--log-level", "log_level", str, "DEBUG, INFO, WARNING, ERROR (FERRY_BROKER_LOG_LEVEL)"),
    ("--namesrv", "namesrv", str, "namesrv address(es) for the trace topic exporter, empty = "
     "none (FERRY_BROKER_NAMESRV)"),
    ("--auto-create-topics", "auto_create_topics", bool,
     "create unknown topics on first SEND (FERRY_BROKER_AUTO_CREATE_TOPICS)"),
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
parse_args = ENTRY.parse
main = ENTRY.main


if __name__ == "__main__":
    sys.exit(main())
