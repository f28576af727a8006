"""Entry point: `python -m ferry_broker` or `ferry-broker`."""
from __future__ import annotations

import argparse
import sys

DESCRIPTION = (
    "Broker: stores and serves messages (send, long-polling pull, consumer offsets, queue locks, message query, master/slave replication) on its log store directory. "
    "Configured by FERRY_BROKER_* environment variables."
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ferry-broker", description=DESCRIPTION)
    parser.parse_args(argv)
    print("ferry_broker: not built yet; this service arrives in a later issue.", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
