"""Which permission each scheduler route needs when auth is on (docs/security.md, "HTTP APIs")."""
from __future__ import annotations

from ferry.service.auth import RouteTable, admin

ROUTES: RouteTable = {
    ("GET", "/v1/stats"): (admin("read"),),
    ("GET", "/metrics"): (admin("read"),),
    # Cancelling reaches into any producer's delayed messages: the admin area `delay`.
    ("POST", "/v1/delayed/{msg_id}/cancel"): (admin("delay"),),
}
