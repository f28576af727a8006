"""The console's HTTP app: the pages under /console, and the kit's health, readiness, OpenAPI.

- `GET /healthz`: 200 while the process serves HTTP.
- `GET /readyz`: 200 once its clients are started; 503 before and while stopping.
- `GET /console...`: the pages (HTML; see `ferry_console.pages`).
- `GET /openapi.json`: the list of these paths.

A POST from another site's page is refused with a 403 page (`csrf.py`).
With auth on, every page and action needs a login (`login.py`).
A page that fails shows an HTML error page with the status of its error
(400 bad input, 404 not found, 503 a source unreachable); a bug is a 500 page
and a logged traceback. The process keeps serving either way.
"""
from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from ferry.errors import (
    BusyError,
    ConnectionLostError,
    FerryError,
    GroupNotFoundError,
    InvalidNameError,
    MalformedRequestError,
    MessageNotFoundError,
    RequestTimeoutError,
    TopicNotFoundError,
)
from ferry.log_limit import LogLimiter
from ferry.service import errors as http_errors
from ferry.service.http import METRICS, service_app
from ferry.service.limits import HttpGuard
from ferry.service.metrics import observe_fields
from ferry.service.openapi import document, stats_path

from ferry_console import login
from ferry_console.csrf import same_origin_only
from ferry_console.pages import cluster, groups, messages, offset_resets, services, topics
from ferry_console.pages.common import CONSOLE, Console, render

log = logging.getLogger("ferry_console")
_limited = LogLimiter(log)  # the lines a client causes (ferry.log_limit)

MAX_CONSOLE_HTTP_BODY_BYTES = 256 * 1024   # a resend form of 1000 ids fits
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

_STATUS: list[tuple[type[FerryError], int]] = [
    (InvalidNameError, 400), (MalformedRequestError, 400), (MessageNotFoundError, 404),
    (TopicNotFoundError, 404), (GroupNotFoundError, 404), (BusyError, 503),
    (ConnectionLostError, 503), (RequestTimeoutError, 503),
]


@web.middleware
async def html_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """A failed page becomes an HTML error page with a fitting status; one log line."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        status, message = exc.status, exc.reason or "not found"
    except FerryError as exc:
        status = http_errors.status_for(exc, _STATUS)
        message = f"{type(exc).__name__}: {exc}"
        _limited.info(f"page-failed:{status}", "page failed",
                      extra={"path": request.path, "status": status, "error": message})
    except Exception:
        _limited.log(logging.ERROR, "crash", "page crashed", exc_info=True,
                     extra={"path": request.path})
        status, message = 500, "internal error; see the console's log"
    if not request.path.startswith("/console"):
        return http_errors.json_response({"error": {"code": status, "message": message}},
                                         status=status)
    return render(request, "error.html", status=status, title=f"Error {status}",
                  status_code=status, message=message)


def openapi_document(version: str) -> dict[str, Any]:
    pages = ["/console", "/console/cluster", "/console/topics", "/console/topics/{topic}",
             "/console/groups", "/console/groups/{group}", "/console/groups/{group}/dlq",
             "/console/messages", "/console/messages/{msg_id}", "/console/services"]
    paths: dict[str, Any] = {p: {"get": {"summary": "HTML page", "responses": {
        "200": {"description": "text/html"}}}} for p in pages}
    paths["/console/login"] = {
        "get": {"summary": "Login page (auth on)", "responses": {"200": {"description": "text/html"}}},
        "post": {"summary": "Log in (form: access_key, secret, next)",
                 "responses": {"303": {"description": "logged in: to `next`"},
                               "401": {"description": "wrong access key or secret"},
                               "429": {"description": "too many failed logins from this "
                                                      "address or for this access key"},
                               "503": {"description": "the console holds its maximum of "
                                                      "sessions"}}}}
    paths["/console/logout"] = {"post": {"summary": "Log out",
                                         "responses": {"303": {"description": "to the login"}}}}
    paths["/console/groups/{group}/dlq/resend"] = {"post": {
        "summary": "Resend dead letters (form: id=... repeated, or all=1)",
        "responses": {"303": {"description": "back to the DLQ page"}}}}
    paths["/console/groups/{group}/reset-offsets"] = {"post": {
        "summary": "Reset the group's offsets on a topic (form: topic, to=earliest|latest|"
                   "time|offset|shift, value, dry_run=1, force=1)",
        "responses": {"200": {"description": "a dry run: the plan per queue"},
                      "303": {"description": "reset: back to the group page"}}}}
    paths.update(stats_path("The HTTP limits and how often each refused; logins and "
                            "sessions"))
    return document("ferry-console", version, "Server-rendered pages for operators; "
                    "the console keeps no state.", paths, ready="Its clients are started")


def build_app(console: Console, is_ready: Callable[[], bool], version: str,
              guard: HttpGuard | None = None) -> web.Application:
    # html_errors outermost: the origin check's own 403 is a page already. The origin
    # check before the login: a cross-site login form is refused too.
    app = service_app(guard, html_errors, openapi_document(version), ready=is_ready,
                      max_body_bytes=MAX_CONSOLE_HTTP_BODY_BYTES,
                      not_ready="not ready: starting or stopping",
                      stats=lambda: {"login": login.login_stats(console)},
                      middlewares=[same_origin_only, login.login_required])
    app[CONSOLE] = console
    # /metrics (docs/metrics.md): sessions and logins (with auth on; a session to read it).
    observe_fields(app[METRICS], "ferry.console", lambda: login.login_stats(console), {
        "sessions": ("sessions", "gauge", "{session}", "Sessions held"),
        "logins": ("logins", "counter", "{login}", "Logins accepted"),
        "failed_logins": ("failed_logins", "counter", "{login}", "Logins refused")})
    for family in (login, cluster, topics, groups, offset_resets, messages, services):
        family.register(app.router)
    return app
