"""Entry point: `python -m ferry_namesrv` or `ferry-namesrv`."""
from __future__ import annotations

import argparse
import sys

DESCRIPTION = (
    "Name server: topic routes, topic and group config, broker liveness as clients see it. Stateless: etcd is the truth; each instance watches etcd and serves a cache over HTTP. "
    "Configured by FERRY_NAMESRV_* environment variables."
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ferry-namesrv", description=DESCRIPTION)
    parser.parse_args(argv)
    print("ferry_namesrv: not built yet; this service arrives in a later issue.", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
