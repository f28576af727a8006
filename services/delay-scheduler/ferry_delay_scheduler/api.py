"""The scheduler's HTTP API: health, readiness, statistics, cancel, and its OpenAPI document.

- `GET /healthz`: 200 while the process serves HTTP.
- `GET /readyz`: 200 once serving, on the leader and on a standby alike
  (`role` says which one pulls and delivers); 503 before that and while stopping.
- `GET /v1/stats`: role, pending, due in the next minute, delivered,
  duplicates after a crash, cancelled, lateness histogram.
- `POST /v1/delayed/{msg_id}/cancel`: see cancel.py.

Every failure is the JSON error body of namesrv: `{"error": {"code", "type",
"message"}}` (plus `leader` on a standby's 503).
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from aiohttp import web
from ferry.auth.http import HttpAuth, document_auth
from ferry.errors import (
    AlreadyDeliveredError,
    BusyError,
    FerryError,
    MalformedRequestError,
    MessageNotFoundError,
)
from ferry.http_errors import error_middleware, json_response
from ferry.http_limits import HttpGuard, HttpLimits

from ferry_delay_scheduler.cancel import Canceller, NotLeaderError
from ferry_delay_scheduler.openapi import openapi_document

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 64 * 1024

_STATUS: list[tuple[type[FerryError], int]] = [
    (MalformedRequestError, 400), (MessageNotFoundError, 404), (AlreadyDeliveredError, 409),
    (BusyError, 503),
]


def _leader(exc: FerryError) -> dict[str, Any]:
    # A standby's 503 names the leader, so a client can retry there.
    return {"leader": exc.leader} if isinstance(exc, NotLeaderError) else {}


errors_and_logs = error_middleware(_STATUS, log, "scheduler", _leader)


def build_app(stats: Callable[[], dict[str, Any]], is_ready: Callable[[], bool],
              role: Callable[[], str], canceller: Canceller, version: str,
              auth: HttpAuth | None = None,
              guard: HttpGuard | None = None) -> web.Application:
    """The HTTP app; with `auth` (FERRY_AUTH=on) every route but the probes and the OpenAPI
    document needs a signed request and its permission (permissions.py)."""
    guard = guard or HttpGuard(HttpLimits(max_body_bytes=MAX_BODY_BYTES))
    document = openapi_document(version)
    if auth is not None:
        document = document_auth(document)   # 401/403 and the signature headers

    async def healthz(_: web.Request) -> web.Response:
        return json_response({"status": "ok"})

    async def readyz(_: web.Request) -> web.Response:
        if not is_ready():
            raise BusyError("not ready: recovering or stopping")
        return json_response({"status": "ready", "role": role()})

    async def get_stats(_: web.Request) -> web.Response:
        return json_response({**stats(), "limits": guard.as_json()})

    async def cancel(request: web.Request) -> web.Response:
        if not is_ready():
            raise BusyError("not ready: recovering or stopping")
        return json_response(await canceller.cancel(request.match_info["msg_id"]))

    async def openapi(_: web.Request) -> web.Response:
        return json_response(document)

    app = guard.application([errors_and_logs] if auth is None
                            else [errors_and_logs, auth.middleware])
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/v1/stats", get_stats)
    app.router.add_post("/v1/delayed/{msg_id}/cancel", cancel)
    app.router.add_get("/openapi.json", openapi)
    return app
