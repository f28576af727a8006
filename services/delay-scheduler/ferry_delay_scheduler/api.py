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
from ferry.errors import (
    AlreadyDeliveredError,
    BusyError,
    FerryError,
    MalformedRequestError,
    MessageNotFoundError,
)
from ferry.service.auth import HttpAuth
from ferry.service.errors import error_middleware, json_response
from ferry.service.http import METRICS, service_app
from ferry.service.limits import HttpGuard
from ferry.service.metrics import Field, observe_fields

from ferry_delay_scheduler.cancel import Canceller, NotLeaderError
from ferry_delay_scheduler.openapi import openapi_document

log = logging.getLogger(__name__)

NOT_READY = "not ready: recovering or stopping"

_STATUS: list[tuple[type[FerryError], int]] = [
    (MalformedRequestError, 400), (MessageNotFoundError, 404), (AlreadyDeliveredError, 409),
    (BusyError, 503),
]


def _leader(exc: FerryError) -> dict[str, Any]:
    # A standby's 503 names the leader, so a client can retry there.
    return {"leader": exc.leader} if isinstance(exc, NotLeaderError) else {}


errors_and_logs = error_middleware(_STATUS, log, "scheduler", _leader)
#: The /metrics instruments read from /v1/stats (`ferry.scheduler.<name>`, docs/metrics.md).
METRIC_FIELDS: dict[str, Field] = {
    "pending": ("pending", "gauge", "{message}", "Delayed messages waiting (this term)"),
    "due_next_minute": ("due_next_minute", "gauge", "{message}",
                        "Delayed messages due within the next minute"),
    "taken": ("taken", "counter", "{message}", "Delayed messages taken over from brokers"),
    "delivered": ("delivered", "counter", "{message}", "Delayed messages delivered"),
    "cancelled": ("cancelled", "counter", "{message}", "Delayed messages cancelled"),
    "delivery_errors": ("delivery_errors", "counter", "{error}", "Failed delivery attempts"),
}


def build_app(stats: Callable[[], dict[str, Any]], is_ready: Callable[[], bool],
              role: Callable[[], str], canceller: Canceller, version: str,
              auth: HttpAuth | None = None,
              guard: HttpGuard | None = None) -> web.Application:
    """The HTTP app; with `auth` (FERRY_AUTH=on) every route but the probes and the OpenAPI
    document needs a signed request and its permission (permissions.py)."""
    app = service_app(guard, errors_and_logs, openapi_document(version), ready=is_ready,
                      not_ready=NOT_READY, ready_fields=lambda: {"role": role()}, stats=stats,
                      auth=auth)

    async def cancel(request: web.Request) -> web.Response:
        if not is_ready():
            raise BusyError(NOT_READY)
        return json_response(await canceller.cancel(request.match_info["msg_id"]))

    app.router.add_post("/v1/delayed/{msg_id}/cancel", cancel)
    observe_fields(app[METRICS], "ferry.scheduler", stats, METRIC_FIELDS)
    return app
