"""Entry point: `python -m ferry_dedup` or `ferry-dedup`."""
from __future__ import annotations

import argparse
import sys

DESCRIPTION = (
    "Idempotence service: a fast Redis claim (weak check) and the ledger table (strong check), with reconciliation of the ledger. "
    "Configured by FERRY_DEDUP_* environment variables."
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ferry-dedup", description=DESCRIPTION)
    parser.parse_args(argv)
    print("ferry_dedup: not built yet; this service arrives in a later issue.", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
