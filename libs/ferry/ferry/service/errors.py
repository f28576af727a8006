"""The JSON error bodies every Ferry HTTP API answers with, and the middleware that makes them.

A failure is `{"error": {"code", "type", "message"}}` (docs/protocol.md), with
the HTTP status a service maps from the error's class. `error_middleware`
builds the aiohttp middleware every service's API runs (`ferry.service.http`):
every failure becomes such a body and one log line; a service whose handlers
raise other exceptions it can name (namesrv: etcd away) passes `convert`.
"""
from __future__ import annotations

import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Middleware

from ferry.errors import (
    AccessDeniedError,
    AuthenticationError,
    FerryError,
    MalformedRequestError,
    MessageTooLargeError,
    SystemError_,
)
from ferry.log_limit import LogLimiter

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
# (error class, HTTP status) pairs, the first match wins; no match is 500.
StatusTable = Sequence[tuple[type[FerryError], int]]
# Fields a service adds to the body of some errors (the leader on a standby's 503).
ExtraFields = Callable[[FerryError], Mapping[str, Any]]
# A failure that is not a FerryError as the FerryError to answer with; None: a bug (500).
Convert = Callable[[Exception], FerryError | None]

#: Statuses every service shares, checked before its own table: an unauthenticated
#: request is 401 and a refused one 403 wherever it arrives (docs/security.md).
AUTH_STATUSES: StatusTable = ((AuthenticationError, 401), (AccessDeniedError, 403))


def status_for(exc: FerryError, statuses: StatusTable) -> int:
    """The HTTP status of `exc`: 401/403 for the auth errors, else the first class in
    `statuses` it is an instance of, else 500."""
    for cls, status in AUTH_STATUSES:
        if isinstance(exc, cls):
            return status
    return next((status for cls, status in statuses if isinstance(exc, cls)), 500)


def error_body(exc: FerryError, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The `{"error": {...}}` body of `exc`, with `extra` fields added to the inner object."""
    # Subclasses local to a module (InvalidConfigError) report the shared class
    # whose code they carry, so clients can map `type` back to ferry.errors.
    cls = next((c for c in type(exc).__mro__ if c.__module__ == "ferry.errors"), type(exc))
    err: dict[str, Any] = {"code": exc.code, "type": cls.__name__, "message": str(exc)}
    err.update(extra or {})
    return {"error": err}


def json_response(data: Any, status: int = 200) -> web.Response:
    """`data` as a compact JSON response."""
    return web.json_response(data, status=status,
                             dumps=lambda d: json.dumps(d, separators=(",", ":")))


def from_http(exc: web.HTTPException, request: web.Request) -> FerryError:
    """The FerryError answering aiohttp's own refusal (no route, wrong method, body too large)."""
    if exc.status == 404:
        return MalformedRequestError(f"no endpoint {request.method} {request.path}")
    if exc.status == 405:
        return MalformedRequestError(f"method {request.method} not allowed on {request.path}")
    if exc.status == 413:
        return MessageTooLargeError(f"request body larger than "
                                    f"{request.client_max_size} bytes")
    return MalformedRequestError(exc.reason)


def error_middleware(statuses: StatusTable, log: logging.Logger, service: str,
                     extra: ExtraFields | None = None, convert: Convert | None = None
                     ) -> Middleware:
    """A middleware mapping every failure to a JSON error body; one log line per failure,
    rate-limited per status and path (ferry.log_limit: a client cannot flood the log).

    `service` names the log the 500 body points at ("see the scheduler log").
    """
    limited = LogLimiter(log)

    def body(exc: FerryError) -> dict[str, Any]:
        return error_body(exc, extra(exc) if extra is not None else None)

    def answer(request: web.Request, status: int, err: FerryError,
               started: float) -> web.Response:
        _log_error(limited, request, status, err, started)
        return json_response(body(err), status=status)

    @web.middleware
    async def errors_and_logs(request: web.Request, handler: Handler) -> web.StreamResponse:
        started = time.perf_counter()
        try:
            response = await handler(request)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            return answer(request, exc.status, from_http(exc, request), started)
        except FerryError as exc:
            return answer(request, status_for(exc, statuses), exc, started)
        except Exception as exc:
            err = convert(exc) if convert is not None else None
            if err is not None:
                return answer(request, status_for(err, statuses), err, started)
            limited.log(logging.ERROR, "crash", "unexpected failure", exc_info=True,
                        extra=_fields(request, 500, started))
            return json_response(body(SystemError_(f"internal error; see the {service} log")),
                                 status=500)
        log.debug("request", extra=_fields(request, response.status, started))
        return response

    return errors_and_logs


def _fields(request: web.Request, status: int, started: float) -> dict[str, object]:
    return {"method": request.method, "path": request.path, "status": status,
            "duration_ms": round((time.perf_counter() - started) * 1000, 3),
            "remote": request.remote}


def _log_error(limited: LogLimiter, request: web.Request, status: int, err: FerryError,
               started: float) -> None:
    limited.warning(f"{status} {request.path}", "request failed",
                    extra={**_fields(request, status, started), "error": str(err)})
