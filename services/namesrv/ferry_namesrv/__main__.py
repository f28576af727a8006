"""Entry point: `python -m ferry_namesrv` or `ferry-namesrv`."""
from __future__ import annotations

import argparse
import asyncio
import sys

from ferry.telemetry.logs import setup_logging

from ferry_namesrv.app import NamesrvApp
from ferry_namesrv.config import ConfigError, NamesrvConfig, parse_bool

DESCRIPTION = (
    "Ferry name server. It owns what clients need to find messages: topic routes "
    "(which broker groups serve a topic, their master and slave addresses, queue counts), "
    "topic and group configuration, and broker liveness as clients see it. It keeps no "
    "state of its own: etcd is the truth, brokers register there under leases, and each "
    "instance watches etcd and answers over HTTP from its cache, so any number can run side "
    "by side. Configured by FERRY_NAMESRV_* environment variables; the flags below "
    "override them."
)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ferry-namesrv", description=DESCRIPTION)
    p.add_argument("--host", help="HTTP listen address (FERRY_NAMESRV_HOST, 127.0.0.1)")
    p.add_argument("--port", type=int, help="HTTP port, 0 = any free one "
                                            "(FERRY_NAMESRV_PORT, 9876)")
    p.add_argument("--etcd", help="etcd endpoints host:port[,host:port] "
                                  "(FERRY_NAMESRV_ETCD, 127.0.0.1:2379)")
    p.add_argument("--etcd-prefix", help="key prefix in etcd (FERRY_NAMESRV_ETCD_PREFIX, /ferry/)")
    p.add_argument("--auto-create-topics", metavar="BOOL",
                   help="create unknown topics on GET /v1/routes/{topic}?create=1 "
                        "(FERRY_NAMESRV_AUTO_CREATE_TOPICS, true)")
    p.add_argument("--default-queues", type=int, help="queues of an auto-created topic "
                                                      "(FERRY_NAMESRV_DEFAULT_QUEUES, 8)")
    p.add_argument("--console-url", help="where GET /console redirects (FERRY_NAMESRV_CONSOLE_URL, "
                                        "http://127.0.0.1:10927/console)")
    p.add_argument("--log-level", type=str.upper, choices=["DEBUG", "INFO", "WARNING", "ERROR"],
                   help="FERRY_NAMESRV_LOG_LEVEL, INFO")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        config = NamesrvConfig.from_env().with_overrides(
            host=args.host, port=args.port, etcd=args.etcd, etcd_prefix=args.etcd_prefix,
            default_queues=args.default_queues, log_level=args.log_level,
            console_url=args.console_url,
            auto_create_topics=None if args.auto_create_topics is None
            else parse_bool(args.auto_create_topics, "--auto-create-topics"))
    except ConfigError as exc:
        print(f"ferry-namesrv: {exc}", file=sys.stderr)
        return 2
    setup_logging(config.log_level)
    asyncio.run(NamesrvApp(config).run())
    return 0


if __name__ == "__main__":
    sys.exit(main())
