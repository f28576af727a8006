"""Entry point: `python -m ferry_txn_checker` or `ferry-txn-checker`."""
from __future__ import annotations

import argparse
import sys

DESCRIPTION = (
    "Transaction checker: resolves transactional half messages left undecided by asking a live producer of the group (check-back), and rolls back after the check limit. "
    "Configured by FERRY_TXN_CHECKER_* environment variables."
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ferry-txn-checker", description=DESCRIPTION)
    parser.parse_args(argv)
    print("ferry_txn_checker: not built yet; this service arrives in a later issue.", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
