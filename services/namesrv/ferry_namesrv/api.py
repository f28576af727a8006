"""The HTTP API: the route table and the error mapping.

Every failure leaves as the JSON error body of docs/internals.md:
`{"error": {"code", "type", "message"}}`. Bad input is a 4xx and a WARNING
log line; etcd away is a 503; only a bug in namesrv is a 500 (logged with its
traceback). The probes, /v1/stats and /openapi.json are the kit's
(`ferry.service.http`).
"""
from __future__ import annotations

import logging
from typing import Any

from aiohttp import web
from ferry.errors import (
    AlreadyExistsError,
    BusyError,
    FerryError,
    GroupNotFoundError,
    InvalidNameError,
    MalformedRequestError,
    MessageTooLargeError,
    NoPermissionError,
    TopicNotFoundError,
)
from ferry.routing import EtcdUnavailable
from ferry.service.auth import HttpAuth, access_key_of
from ferry.service.errors import error_middleware, json_response
from ferry.service.http import METRICS, service_app
from ferry.service.limits import HttpGuard
from ferry.service.metrics import observe_fields

from ferry_namesrv.context import CONTEXT, NamesrvContext
from ferry_namesrv.handlers import brokers, groups, resets, routes, topics, users
from ferry_namesrv.openapi import openapi_document

log = logging.getLogger("ferry_namesrv.api")

_STATUS: list[tuple[type[FerryError], int]] = [
    (InvalidNameError, 400), (MalformedRequestError, 400), (MessageTooLargeError, 413),
    (TopicNotFoundError, 404), (GroupNotFoundError, 404), (AlreadyExistsError, 409),
    (NoPermissionError, 403), (BusyError, 503),
]


def _etcd_away(exc: Exception) -> FerryError | None:
    return BusyError(f"etcd unavailable: {exc}") if isinstance(exc, EtcdUnavailable) else None


errors_and_logs = error_middleware(_STATUS, log, "namesrv", convert=_etcd_away)


def _cache_state(context: NamesrvContext) -> dict[str, Any]:
    """What /readyz shows once the cache has loaded; it then keeps answering from the last
    state even while etcd is briefly unreachable (`watching` false), as a name server should."""
    cache = context.cache
    return {"watching": cache.watching, "revision": cache.revision,
            "brokers": len(cache.brokers), "topics": len(cache.topics),
            "groups": len(cache.groups)}


def build_app(context: NamesrvContext, version: str,
              auth: HttpAuth | None = None,
              guard: HttpGuard | None = None) -> web.Application:
    """The namesrv app; with `auth` (FERRY_AUTH=on) every route but the probes and the
    OpenAPI document needs a signed request and its permission (permissions.py)."""
    app = service_app(guard, errors_and_logs, openapi_document(version),
                      ready=lambda: context.cache.loaded,
                      not_ready="routes not loaded from etcd yet",
                      ready_fields=lambda: _cache_state(context), stats=dict, auth=auth)
    app[CONTEXT] = context
    # /metrics (docs/metrics.md): what the route cache holds.
    observe_fields(app[METRICS], "ferry.namesrv", lambda: _cache_state(context), {
        "brokers": ("brokers", "gauge", "{broker}", "Brokers registered"),
        "topics": ("topics", "gauge", "{topic}", "Topics known"),
        "groups": ("groups", "gauge", "{group}", "Consumer groups known")})

    async def whoami(request: web.Request) -> web.Response:
        # Who the request was signed by: the console checks a login with it.
        return json_response({"access_key": access_key_of(request), "auth": auth is not None})

    async def console(request: web.Request) -> web.Response:
        # The console is its own service (docs/console.md); this is only a signpost.
        raise web.HTTPFound(context.config.console_url)

    app.router.add_get("/v1/routes/{topic}", routes.get_route)
    app.router.add_get("/v1/brokers", brokers.list_brokers)
    app.router.add_get("/v1/whoami", whoami)
    app.router.add_get("/v1/topics", topics.list_topics)
    app.router.add_post("/v1/topics", topics.create_topic)
    app.router.add_get("/v1/topics/{topic}", topics.get_topic)
    app.router.add_put("/v1/topics/{topic}", topics.put_topic)
    app.router.add_delete("/v1/topics/{topic}", topics.delete_topic)
    app.router.add_get("/v1/groups", groups.list_groups)
    app.router.add_post("/v1/groups", groups.create_group)
    app.router.add_get("/v1/groups/{group}", groups.get_group)
    app.router.add_put("/v1/groups/{group}", groups.put_group)
    app.router.add_delete("/v1/groups/{group}", groups.delete_group)
    app.router.add_get("/v1/groups/{group}/resets", resets.get_resets)
    app.router.add_post("/v1/groups/{group}/resets", resets.post_reset)
    # /v1/users, /v1/acl (identities and permissions): refused with auth off
    users.add_routes(app, auth_on=auth is not None)
    app.router.add_get("/console", console)
    return app
