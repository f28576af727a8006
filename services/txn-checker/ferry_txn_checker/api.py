"""The txn-checker's HTTP API: health, readiness, statistics, transactions, OpenAPI.

- `GET /healthz`: 200 while the process serves HTTP.
- `GET /readyz`: 200 once the checkpoint is loaded; 503 before and while stopping.
- `GET /v1/stats`: open, checked, committed/rolled back by check, discarded, ...
- `GET /v1/transactions?state=open|discarded&limit=N`: a list (newest discarded
  first; `limit` 1..1000, default 100).
- `GET /v1/transactions/{msg_id}`: one transaction the checker knows (open,
  discarded, or recently resolved); 404 otherwise.

Every failure is the JSON error body of namesrv: `{"error": {"code", "type", "message"}}`.
"""
from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from ferry.errors import (
    BusyError,
    FerryError,
    MalformedRequestError,
    MessageNotFoundError,
    SystemError_,
)

from ferry_txn_checker.openapi import openapi_document
from ferry_txn_checker.state import Book

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 64 * 1024
DEFAULT_LIST_LIMIT = 100
MAX_LIST_LIMIT = 1000
LIST_STATES = ("open", "discarded")
_MSG_ID = re.compile(r"^[0-9A-Fa-f]{32}$")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

_STATUS: list[tuple[type[FerryError], int]] = [
    (MalformedRequestError, 400), (MessageNotFoundError, 404), (BusyError, 503),
]


def status_for(exc: FerryError) -> int:
    return next((status for cls, status in _STATUS if isinstance(exc, cls)), 500)


def error_body(exc: FerryError) -> dict[str, Any]:
    cls = next((c for c in type(exc).__mro__ if c.__module__ == "ferry.errors"), type(exc))
    return {"error": {"code": exc.code, "type": cls.__name__, "message": str(exc)}}


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
        return json_response(error_body(SystemError_("internal error; see the checker log")),
                             status=500)


def _log_error(request: web.Request, status: int, err: FerryError, started: float) -> None:
    log.warning("request failed", extra={
        "method": request.method, "path": request.path, "status": status, "error": str(err),
        "duration_ms": round((time.perf_counter() - started) * 1000, 3)})


def _limit(request: web.Request) -> int:
    raw = request.query.get("limit", str(DEFAULT_LIST_LIMIT))
    try:
        limit = int(raw)
    except ValueError:
        limit = 0
    if not 1 <= limit <= MAX_LIST_LIMIT:
        raise MalformedRequestError(f"limit must be 1..{MAX_LIST_LIMIT}, not {raw!r}")
    return limit


def build_app(book: Book, stats: Callable[[], dict[str, Any]], is_ready: Callable[[], bool],
              version: str) -> web.Application:
    document = openapi_document(version)

    async def healthz(_: web.Request) -> web.Response:
        return json_response({"status": "ok"})

    async def readyz(_: web.Request) -> web.Response:
        if not is_ready():
            raise BusyError("not ready: loading the checkpoint or stopping")
        return json_response({"status": "ready"})

    async def get_stats(_: web.Request) -> web.Response:
        return json_response(stats())

    async def list_transactions(request: web.Request) -> web.Response:
        state = request.query.get("state", "open")
        if state not in LIST_STATES:
            raise MalformedRequestError(f"state must be one of {', '.join(LIST_STATES)}, "
                                        f"not {state!r}")
        limit = _limit(request)
        items = book.list_open(limit) if state == "open" else book.list_discarded(limit)
        total = book.open_count if state == "open" else len(book.discarded)
        return json_response({"state": state, "total": total, "transactions": items})

    async def describe(request: web.Request) -> web.Response:
        msg_id = request.match_info["msg_id"]
        if not _MSG_ID.match(msg_id):
            raise MalformedRequestError(f"msg_id must be 32 hex characters, not {msg_id!r}")
        found = book.find(msg_id)
        if found is None:
            raise MessageNotFoundError(f"transaction {msg_id.upper()} is not open, not "
                                       "discarded and not recently resolved")
        return json_response(found)

    async def openapi(_: web.Request) -> web.Response:
        return json_response(document)

    app = web.Application(middlewares=[errors_and_logs], client_max_size=MAX_BODY_BYTES)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/v1/stats", get_stats)
    app.router.add_get("/v1/transactions", list_transactions)
    app.router.add_get("/v1/transactions/{msg_id}", describe)
    app.router.add_get("/openapi.json", openapi)
    return app
