"""Which permission each namesrv route needs when auth is on (docs/security.md, "HTTP APIs").

Reads a client needs to do its work take the client's own rights: a topic's
route is for whoever may publish to or subscribe to it (or consume as the
group of a `%RETRY%`/`%DLQ%` topic); a group's config for whoever consumes
as it. Lists and every write take the admin area they touch. Any identity
may list the brokers (their addresses are what every client dials) and ask
who it is (`/v1/whoami`, the console's login check).
"""
from __future__ import annotations

from collections.abc import Sequence

from aiohttp import web
from ferry.names import DLQ_PREFIX, RETRY_PREFIX
from ferry.service.auth import AUTHENTICATED, Permission, RouteTable, admin

_TRUE = ("1", "true", "yes")
TOPIC_PUB = Permission("pub", "topic:{topic}")
TOPIC_SUB = Permission("sub", "topic:{topic}")
GROUP_CONSUME = Permission("consume", "group:{group}")
GROUP_RESET = Permission("reset", "group:{group}")


def route_rule(request: web.Request) -> Sequence[tuple[str, str]]:
    """GET /v1/routes/{topic}: publish or subscribe rights on it (publish or admin topics
    to auto-create it), consume on the group of a retry/DLQ topic, or admin read."""
    topic = request.match_info.get("topic", "")
    if request.query.get("create", "").lower() in _TRUE:
        return [("pub", "topic:" + topic), ("topics", "admin")]
    needs = [("pub", "topic:" + topic), ("sub", "topic:" + topic), ("read", "admin")]
    for prefix in (RETRY_PREFIX, DLQ_PREFIX):
        if topic.startswith(prefix):
            needs.append(("consume", "group:" + topic[len(prefix):]))
    return needs


ROUTES: RouteTable = {
    ("GET", "/v1/routes/{topic}"): route_rule,
    ("GET", "/v1/brokers"): AUTHENTICATED,
    ("GET", "/v1/whoami"): AUTHENTICATED,
    ("GET", "/v1/stats"): (admin("read"),),   # the HTTP limits counters
    ("GET", "/metrics"): (admin("read"),),
    ("GET", "/console"): AUTHENTICATED,
    ("GET", "/v1/topics"): (admin("read"),),
    ("POST", "/v1/topics"): (admin("topics"),),
    ("GET", "/v1/topics/{topic}"): (TOPIC_PUB, TOPIC_SUB, admin("read")),
    ("PUT", "/v1/topics/{topic}"): (admin("topics"),),
    ("DELETE", "/v1/topics/{topic}"): (admin("topics"),),
    ("GET", "/v1/groups"): (admin("read"),),
    ("POST", "/v1/groups"): (admin("groups"),),
    ("GET", "/v1/groups/{group}"): (GROUP_CONSUME, admin("read")),
    ("PUT", "/v1/groups/{group}"): (admin("groups"),),
    ("DELETE", "/v1/groups/{group}"): (admin("groups"),),
    # The record of offset resets (handlers/resets.py): written by whoever may reset.
    ("GET", "/v1/groups/{group}/resets"): (GROUP_RESET, GROUP_CONSUME, admin("read")),
    ("POST", "/v1/groups/{group}/resets"): (GROUP_RESET,),
    # Identities and their rules (the handlers are in handlers/users.py and handlers/acl.py).
    ("GET", "/v1/users"): (admin("users"),),
    ("POST", "/v1/users"): (admin("users"),),
    ("GET", "/v1/users/{access_key}"): (admin("users"),),
    ("DELETE", "/v1/users/{access_key}"): (admin("users"),),
    ("GET", "/v1/acl"): (admin("users"),),
    ("GET", "/v1/acl/{access_key}"): (admin("users"),),
    ("POST", "/v1/acl/{access_key}"): (admin("users"),),
    ("PUT", "/v1/acl/{access_key}"): (admin("users"),),
    ("DELETE", "/v1/acl/{access_key}"): (admin("users"),),
}
