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

import logging
import re
from collections.abc import Callable
from typing import Any

from aiohttp import web
from ferry.errors import (
    BusyError,
    FerryError,
    MalformedRequestError,
    MessageNotFoundError,
)
from ferry.service.auth import HttpAuth
from ferry.service.errors import error_middleware, json_response
from ferry.service.http import METRICS, service_app
from ferry.service.limits import HttpGuard
from ferry.service.metrics import observe_counts, single

from ferry_txn_checker.openapi import openapi_document
from ferry_txn_checker.state import Book

log = logging.getLogger(__name__)

DEFAULT_LIST_LIMIT = 100
MAX_LIST_LIMIT = 1000
LIST_STATES = ("open", "discarded")
_MSG_ID = re.compile(r"^[0-9A-Fa-f]{32}$")

_STATUS: list[tuple[type[FerryError], int]] = [
    (MalformedRequestError, 400), (MessageNotFoundError, 404), (BusyError, 503),
]


errors_and_logs = error_middleware(_STATUS, log, "checker")


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
              version: str,
              auth: HttpAuth | None = None,
              guard: HttpGuard | None = None) -> web.Application:
    """The HTTP app; with `auth` (FERRY_AUTH=on) every route but the probes and the OpenAPI
    document needs a signed request and its permission (permissions.py)."""
    app = service_app(guard, errors_and_logs, openapi_document(version), ready=is_ready,
                      not_ready="not ready: loading the checkpoint or stopping", stats=stats,
                      auth=auth)
    # /metrics (docs/metrics.md): open halves, and what became of the checked ones.
    app[METRICS].observe("ferry.txn_checker.open", "gauge", "{transaction}",
                         "Half messages neither committed nor rolled back yet",
                         lambda: single(book.open_count))
    observe_counts(app[METRICS], "ferry.txn_checker.events", "event",
                   "Check-backs and how transactions ended (checked, committed_by_check, ...)",
                   lambda: book.counters)

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

    app.router.add_get("/v1/transactions", list_transactions)
    app.router.add_get("/v1/transactions/{msg_id}", describe)
    return app
