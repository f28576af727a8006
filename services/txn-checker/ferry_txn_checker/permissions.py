"""Which permission each txn-checker route needs when auth is on (docs/security.md, "HTTP APIs").

Every route reads: admin `read` (stats and queries), or `txn` (who resolves
transactions may also look at them).
"""
from __future__ import annotations

from ferry.service.auth import RouteTable, admin

_READ = (admin("read"), admin("txn"))

ROUTES: RouteTable = {
    ("GET", "/v1/stats"): _READ,
    ("GET", "/metrics"): _READ,
    ("GET", "/v1/transactions"): _READ,
    ("GET", "/v1/transactions/{msg_id}"): _READ,
}
