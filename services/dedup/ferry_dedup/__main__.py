"""`python -m ferry_dedup` or `ferry-dedup`: flags over the FERRY_DEDUP_* variables."""
from __future__ import annotations

import sys

from ferry.service.startup import Entry, Flag

from ferry_dedup.config import DedupConfig

DESCRIPTION = (
    "Ferry dedup: idempotence over HTTP for consumers that are not Python or not "
    "in-process (Redis claims: claim, confirm, release; ledger look-ups by business key or "
    "message id), and reconciliation of a topic's stored messages against the ledger, on "
    "demand (POST /v1/reconcile, `ferry dedup reconcile`) and every RECONCILE_INTERVAL_S "
    "for the RECONCILE targets. Reports are kept in DATA_DIR/reports. HTTP: /healthz, "
    "/readyz, /v1/health, /v1/claims, /v1/ledger, /v1/reconcile, /v1/reports, /v1/stats, "
    "/openapi.json. Configured by FERRY_DEDUP_* environment variables; flags override them."
)

_FLAGS: list[Flag] = [
    "host", "http_port", ("data_dir", str, "reports and the default SQLite ledger"), "namesrv",
    ("redis", str, "Redis URL for claims"),
    ("ledger_url", str, "sqlite:///PATH or postgresql://...; empty: sqlite:///DATA_DIR/ledger.db"),
    ("reconcile", str, "scheduled targets topic:group[:scene],..."),
    ("reconcile_interval_s", int, "seconds between scheduled runs"), "log_level",
]
main = Entry("ferry-dedup", DESCRIPTION, _FLAGS, DedupConfig.from_env, "ferry_dedup.app:DedupApp",
             "dedup").main


if __name__ == "__main__":
    sys.exit(main())
