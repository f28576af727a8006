"""Which permission each dedup route needs when auth is on (docs/security.md, "HTTP APIs").

Claims are the service's work for consumers: any known identity may claim,
confirm and release (a scene is not a resource the ACL names; a token from
the claim is needed to confirm or release it). Look-ups, reports,
reconciliation and statistics are admin `read`.
"""
from __future__ import annotations

from ferry.service.auth import AUTHENTICATED, RouteTable, admin

_READ = (admin("read"),)

ROUTES: RouteTable = {
    ("GET", "/v1/health"): AUTHENTICATED,
    ("POST", "/v1/claims"): AUTHENTICATED,
    ("POST", "/v1/claims/confirm"): AUTHENTICATED,
    ("POST", "/v1/claims/release"): AUTHENTICATED,
    ("GET", "/v1/ledger"): _READ,
    ("GET", "/v1/ledger/messages/{msg_id}"): _READ,
    ("POST", "/v1/reconcile"): _READ,
    ("GET", "/v1/reports"): _READ,
    ("GET", "/v1/reports/{report_id}"): _READ,
    ("GET", "/v1/stats"): _READ,
}
