"""Entry point: `python -m ferry_txn_checker` or `ferry-txn-checker`.

Configuration comes from FERRY_TXN_CHECKER_* environment variables; a flag
given on the command line wins over the variable.
"""
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
    ("--host", "host", str, "HTTP listen address (FERRY_TXN_CHECKER_HOST)"),
    ("--http-port", "http_port", int, "HTTP port, 0 = any free one "
     "(FERRY_TXN_CHECKER_HTTP_PORT, 10923)"),
    ("--data-dir", "data_dir", str, "checkpoint directory (FERRY_TXN_CHECKER_DATA_DIR)"),
    ("--namesrv", "namesrv", str, "namesrv address(es) (FERRY_TXN_CHECKER_NAMESRV)"),
    ("--instance-id", "instance_id", str, "this instance's id (FERRY_TXN_CHECKER_INSTANCE_ID)"),
    ("--check-immunity-ms", "check_immunity_ms", int,
     "default wait before a half's first check (FERRY_TXN_CHECKER_CHECK_IMMUNITY_MS)"),
    ("--check-interval-ms", "check_interval_ms", int,
     "wait between checks (FERRY_TXN_CHECKER_CHECK_INTERVAL_MS)"),
    ("--max-checks", "max_checks", int,
     "checks before a rollback as discarded (FERRY_TXN_CHECKER_MAX_CHECKS)"),
    ("--log-level", "log_level", str, "DEBUG, INFO, WARNING, ERROR "
     "(FERRY_TXN_CHECKER_LOG_LEVEL)"),
]


ENTRY = Entry("ferry-txn-checker", DESCRIPTION, _FLAGS, CheckerConfig.from_env,
              "ferry_txn_checker.app:CheckerApp", "txn-checker")
parse_args = ENTRY.parse
main = ENTRY.main


if __name__ == "__main__":
    sys.exit(main())
