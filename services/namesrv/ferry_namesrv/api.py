"""The HTTP API: the route table, error mapping and request logging.

Every failure leaves as the JSON error body of docs/internals.md:
`{"error": {"code", "type", "message"}}`. Bad input is a 4xx and a WARNING
log line; only a bug in namesrv is a 500 (logged with its traceback).
"""
from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable

from aiohttp import web
from ferry import http_errors
from ferry.auth.http import HttpAuth, access_key_of, document_auth
from ferry.errors import (
    AlreadyExistsError,
    BusyError,
    FerryError,
    GroupNotFoundError,
    InvalidNameError,
    MalformedRequestError,
    MessageTooLargeError,
    NoPermissionError,
    SystemError_,
    TopicNotFoundError,
)
from ferry.http_limits import MAX_HTTP_BODY_BYTES, HttpGuard, HttpLimits
from ferry.log_limit import LogLimiter
from ferry.routing import EtcdUnavailable

from ferry_namesrv.context import CONTEXT, NamesrvContext
from ferry_namesrv.handlers import brokers, groups, health, routes, topics, users
from ferry_namesrv.handlers.common import json_response
from ferry_namesrv.openapi import openapi_document

log = logging.getLogger("ferry_namesrv.api")
_limited = LogLimiter(log)  # the lines a client causes (ferry.log_limit)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

_STATUS: list[tuple[type[FerryError], int]] = [
    (InvalidNameError, 400), (MalformedRequestError, 400), (MessageTooLargeError, 413),
    (TopicNotFoundError, 404), (GroupNotFoundError, 404), (AlreadyExistsError, 409),
    (NoPermissionError, 403), (BusyError, 503),
]


def _from_http(exc: web.HTTPException, request: web.Request) -> FerryError:
    if exc.status == 404:
        return MalformedRequestError(f"no endpoint {request.method} {request.path}")
    if exc.status == 405:
        return MalformedRequestError(f"method {request.method} not allowed on {request.path}")
    if exc.status == 413:
        return MessageTooLargeError(f"request body larger than {MAX_HTTP_BODY_BYTES} bytes")
    return MalformedRequestError(exc.reason)


@web.middleware
async def errors_and_logs(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Map every failure to a JSON error; log one line per request."""
    started = time.perf_counter()
    try:
        response = await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        err = _from_http(exc, request)
        response = json_response(http_errors.error_body(err), status=exc.status)
        _log_error(request, exc.status, err, started)
        return response
    except FerryError as exc:
        status = http_errors.status_for(exc, _STATUS)
        _log_error(request, status, exc, started)
        return json_response(http_errors.error_body(exc), status=status)
    except EtcdUnavailable as exc:
        err = BusyError(f"etcd unavailable: {exc}")
        _log_error(request, 503, err, started)
        return json_response(http_errors.error_body(err), status=503)
    except Exception:
        _limited.log(logging.ERROR, "crash", "unexpected failure", exc_info=True,
                     extra=_fields(request, 500, started))
        return json_response(http_errors.error_body(SystemError_("internal error; see the namesrv log")),
                             status=500)
    log.debug("request", extra=_fields(request, response.status, started))
    return response


def _fields(request: web.Request, status: int, started: float) -> dict[str, object]:
    return {"method": request.method, "path": request.path, "status": status,
            "duration_ms": round((time.perf_counter() - started) * 1000, 3),
            "remote": request.remote}


def _log_error(request: web.Request, status: int, err: FerryError, started: float) -> None:
    fields = _fields(request, status, started)
    fields["error"] = str(err)
    # A flood (of 401s, say) is bounded: ferry.log_limit's burst per key, total per minute.
    _limited.warning(f"{status} {request.path}", "request failed", extra=fields)


def build_app(context: NamesrvContext, version: str,
              auth: HttpAuth | None = None,
              guard: HttpGuard | None = None) -> web.Application:
    """The namesrv app; with `auth` (FERRY_AUTH=on) every route but the probes and the
    OpenAPI document needs a signed request and its permission (permissions.py)."""
    guard = guard or HttpGuard(HttpLimits())
    app = guard.application([errors_and_logs] if auth is None
                            else [errors_and_logs, auth.middleware])
    app[CONTEXT] = context
    document = openapi_document(version)
    if auth is not None:
        document = document_auth(document)   # 401/403 and the signature headers

    async def openapi(request: web.Request) -> web.Response:
        return json_response(document)

    async def stats(request: web.Request) -> web.Response:
        return json_response({"limits": guard.as_json()})

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
    users.add_routes(app)   # /v1/users, /v1/acl (identities and permissions)
    app.router.add_get("/healthz", health.healthz)
    app.router.add_get("/readyz", health.readyz)
    app.router.add_get("/v1/stats", stats)
    app.router.add_get("/openapi.json", openapi)
    app.router.add_get("/console", console)
    return app
