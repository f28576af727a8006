"""`python -m ferry_txn_checker` or `ferry-txn-checker`: flags over the
FERRY_TXN_CHECKER_* variables."""
from __future__ import annotations

import sys

from ferry.service.startup import Entry, Flag

from ferry_txn_checker.config import CheckerConfig

DESCRIPTION = (
    "Ferry txn-checker: resolves transactional half messages left undecided. It scans "
    "%HALF% against %OP% on every broker, checks each half with no op older than its "
    "immunity through its broker (which asks a live producer of the group), checks again "
    "every CHECK_INTERVAL_MS, and after MAX_CHECKS rolls it back and lists it as discarded. "
    "Its scan checkpoint lives in DATA_DIR. HTTP: /healthz, /readyz, /v1/stats, "
    "/v1/transactions, /v1/transactions/{msg_id}, /openapi.json. Configured by "
    "FERRY_TXN_CHECKER_* environment variables; flags override them."
)

_FLAGS: list[Flag] = [
    "host", "http_port", ("data_dir", str, "checkpoint directory"), "namesrv", "instance_id",
    ("check_immunity_ms", int, "default wait before a half's first check"),
    ("check_interval_ms", int, "wait between checks"),
    ("max_checks", int, "checks before a rollback as discarded"),
    "log_level",
]
main = Entry("ferry-txn-checker", DESCRIPTION, _FLAGS, CheckerConfig.from_env,
             "ferry_txn_checker.app:CheckerApp", "txn-checker").main


if __name__ == "__main__":
    sys.exit(main())
