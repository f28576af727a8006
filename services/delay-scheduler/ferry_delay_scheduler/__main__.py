"""Entry point: `python -m ferry_delay_scheduler` or `ferry-delay-scheduler`."""
from __future__ import annotations

import argparse
import sys

DESCRIPTION = (
    "Delay scheduler: delayed and scheduled delivery and the back-off of consumer retries, kept in a timing wheel over its own log store. "
    "Configured by FERRY_DELAY_SCHEDULER_* environment variables."
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ferry-delay-scheduler", description=DESCRIPTION)
    parser.parse_args(argv)
    print("ferry_delay_scheduler: not built yet; this service arrives in a later issue.", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
