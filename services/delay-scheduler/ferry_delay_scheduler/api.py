"""The scheduler's HTTP API: health, readiness, statistics, cancel, and its OpenAPI document.

- `GET /healthz`: 200 while the process serves HTTP.
- `GET /readyz`: 200 once the local log is recovered and the wheel open, on
  the leader and on a standby alike (both deliver what their own log holds;
  `role` says which one pulls); 503 before that and while stopping.
- `GET /v1/stats`: role, pending, due in the next minute, delivered,
  duplicates after a crash, cancelled, lateness histogram.
- `POST /v1/delayed/{msg_id}/cancel`: see cancel.py.

Every failure is the JSON error body of namesrv: `{"error": {"code", "type",
"message"}}` (plus `leader` on a standby's 503).
"""
from __future__ import annotations

import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from ferry.errors import (
    AlreadyDeliveredError,
    BusyError,
    FerryError,
    MalformedRequestError,
    MessageNotFoundError,
    SystemError_,
)

from ferry_delay_scheduler.cancel import Canceller, NotLeaderError
from ferry_delay_scheduler.openapi import openapi_document

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 64 * 1024
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

_STATUS: list[tuple[type[FerryError], int]] = [
    (MalformedRequestError, 400), (MessageNotFoundError, 404), (AlreadyDeliveredError, 409),
    (BusyError, 503),
]


def status_for(exc: FerryError) -> int:
    return next((status for cls, status in _STATUS if isinstance(exc, cls)), 500)


def error_body(exc: FerryError) -> dict[str, Any]:
    cls = next((c for c in type(exc).__mro__ if c.__module__ == "ferry.errors"), type(exc))
    err: dict[str, Any] = {"code": exc.code, "type": cls.__name__, "message": str(exc)}
    if isinstance(exc, NotLeaderError):
        err["leader"] = exc.leader
    return {"error": err}


def json_response(data: Any, status: int = 200) -> web.Response:
    return web.json_response(data, status=status,
                             dumps=lambda d: json.dumps(d, separators=(",", ":")))


@web.middleware
async def errors_and_logs(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Map every failure to a JSON error; one log line per failed request."""
    started = time.perf_counter()
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        err: FerryError = MalformedRequestError(
            f"no endpoint {request.method} {request.path}" if exc.status in (404, 405)
            else exc.reason)
        _log_error(request, exc.status, err, started)
        return json_response(error_body(err), status=exc.status)
    except FerryError as exc:
        status = status_for(exc)
        _log_error(request, status, exc, started)
        return json_response(error_body(exc), status=status)
    except Exception:
        log.exception("unexpected failure", extra={"method": request.method,
                                                   "path": request.path})
        return json_response(error_body(SystemError_("internal error; see the scheduler log")),
                             status=500)


def _log_error(request: web.Request, status: int, err: FerryError, started: float) -> None:
    log.warning("request failed", extra={
        "method": request.method, "path": request.path, "status": status, "error": str(err),
        "duration_ms": round((time.perf_counter() - started) * 1000, 3)})


def build_app(stats: Callable[[], dict[str, Any]], is_ready: Callable[[], bool],
              role: Callable[[], str], canceller: Canceller, version: str) -> web.Application:
    document = openapi_document(version)

    async def healthz(_: web.Request) -> web.Response:
        return json_response({"status": "ok"})

    async def readyz(_: web.Request) -> web.Response:
        if not is_ready():
            raise BusyError("not ready: recovering or stopping")
        return json_response({"status": "ready", "role": role()})

    async def get_stats(_: web.Request) -> web.Response:
        return json_response(stats())

    async def cancel(request: web.Request) -> web.Response:
        if not is_ready():
            raise BusyError("not ready: recovering or stopping")
        return json_response(await canceller.cancel(request.match_info["msg_id"]))

    async def openapi(_: web.Request) -> web.Response:
        return json_response(document)

    app = web.Application(middlewares=[errors_and_logs], client_max_size=MAX_BODY_BYTES)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/v1/stats", get_stats)
    app.router.add_post("/v1/delayed/{msg_id}/cancel", cancel)
    app.router.add_get("/openapi.json", openapi)
    return app
