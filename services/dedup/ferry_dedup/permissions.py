"""Which permission each dedup route needs when auth is on (docs/security.md, "HTTP APIs").

Claims are per scene, as topics and groups are: claiming, confirming and
releasing in scene S need `claim` on `scene:S` (the scene is in the JSON
body, which the middleware has read for the signature); a confirm or release
needs the claim's token besides. Look-ups, reports, reconciliation and
statistics are admin `read`.
"""
from __future__ import annotations

import json

from aiohttp import web
from ferry.auth.acl import scene_resource
from ferry.errors import FerryError, MalformedRequestError
from ferry.idempotence.keys import validate_scene
from ferry.service.auth import AUTHENTICATED, SIGNED_BODY, Bound, RouteTable, admin

_READ = (admin("read"),)
#: The action on `scene:<scene>` a claim, confirm or release needs.
CLAIM = "claim"


def scene_rule(request: web.Request) -> Bound:
    """`claim` on the scene the body names. A body with no valid scene is a 400: there is
    no resource to ask the rules about."""
    try:
        doc = json.loads(request.get(SIGNED_BODY, b""))
    except (ValueError, RecursionError):   # UnicodeDecodeError too; [[[... nested deep
        raise MalformedRequestError("the body must be JSON") from None
    scene = doc.get("scene") if isinstance(doc, dict) else None
    if not isinstance(scene, str):
        raise MalformedRequestError("the body must be a JSON object with a scene")
    try:
        validate_scene(scene)
    except FerryError as exc:
        raise MalformedRequestError(str(exc)) from None
    return [(CLAIM, scene_resource(scene))]


ROUTES: RouteTable = {
    ("GET", "/v1/health"): AUTHENTICATED,
    ("POST", "/v1/claims"): scene_rule,
    ("POST", "/v1/claims/confirm"): scene_rule,
    ("POST", "/v1/claims/release"): scene_rule,
    ("GET", "/v1/ledger"): _READ,
    ("GET", "/v1/ledger/messages/{msg_id}"): _READ,
    ("POST", "/v1/reconcile"): _READ,
    ("GET", "/v1/reports"): _READ,
    ("GET", "/v1/reports/{report_id}"): _READ,
    ("GET", "/v1/stats"): _READ,
    ("GET", "/metrics"): _READ,
}
