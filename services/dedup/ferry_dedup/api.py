"""The dedup service's HTTP API (aiohttp); the routes and their documents are in openapi.py.

- `GET /healthz` (the process serves), `GET /readyz` (started), `GET /v1/health`
  (Redis and the ledger database reachable: 200, else 503 naming which is not).
- Claims: `POST /v1/claims` {scene, biz_key, lease_ms?} -> {state, token?};
  `POST /v1/claims/confirm` and `/v1/claims/release` {scene, biz_key, token} -> {ok}.
- Ledger look-ups: `GET /v1/ledger?scene=&biz_key=`, `GET /v1/ledger/messages/{msg_id}`.
- Reconciliation: `POST /v1/reconcile` -> the report; `GET /v1/reports?limit=N`
  (summaries, newest first); `GET /v1/reports/{id}` (the whole report).
- `GET /v1/stats`; `GET /openapi.json`.

Tracing: a claim, confirm or release request that carries a W3C `traceparent`
header (a traced message's consumer sends its context) gets a `dedup` span
(SERVER kind) child of it, with `ferry.outcome` the claim's state or ok; a
request without the header makes no span.

Every failure is the JSON error body of the other services (ferry.service.errors):
bad input 400, unknown topic / row / report 404, Redis or the database away 503.
"""
from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from aiohttp import web
from ferry.errors import (
    BusyError,
    FerryError,
    MalformedRequestError,
    MessageNotFoundError,
    StoreUnavailableError,
    TopicNotFoundError,
)
from ferry.service.auth import HttpAuth
from ferry.service.errors import error_middleware, json_response
from ferry.service.http import METRICS, service_app
from ferry.service.limits import HttpGuard
from ferry.service.metrics import observe_counts
from ferry.telemetry import extract, hop_span, tracing
from opentelemetry.trace import SpanKind

from ferry_dedup.openapi import openapi_document

log = logging.getLogger("ferry_dedup")

DEFAULT_LIST_LIMIT = 20
MAX_LIST_LIMIT = 100
_MSG_ID = re.compile(r"[0-9A-Fa-f]{32}")

_STATUS: list[tuple[type[FerryError], int]] = [
    (MalformedRequestError, 400), (MessageNotFoundError, 404), (TopicNotFoundError, 404),
    (BusyError, 503), (StoreUnavailableError, 503),
]
errors_and_logs = error_middleware(_STATUS, log, "dedup")

Json = dict[str, Any]
#: The W3C trace context header a traced claim request carries.
TRACEPARENT_HEADER = "traceparent"


class Backend(Protocol):
    """What the routes call: the app implements it (see app.DedupApp)."""

    version: str

    @property
    def ready(self) -> bool: ...

    async def claim(self, body: Any) -> Json: ...
    async def finish_claim(self, body: Any, *, confirm: bool) -> Json: ...
    async def lookup_biz_key(self, scene: str, biz_key: str) -> Json | None: ...
    async def lookup_msg_id(self, msg_id: str) -> list[Json]: ...
    async def reconcile(self, body: Any) -> Json: ...
    def reports(self, limit: int) -> tuple[list[Json], int]: ...
    def report(self, report_id: str) -> Json | None: ...
    def stats_document(self) -> Json: ...
    async def health(self) -> tuple[bool, Json]: ...


async def _body(request: web.Request) -> Any:
    try:
        return await request.json()
    except (ValueError, UnicodeDecodeError, RecursionError):   # [[[[... nested too deep
        raise MalformedRequestError("the body must be JSON") from None


def _limit(request: web.Request) -> int:
    raw = request.query.get("limit", str(DEFAULT_LIST_LIMIT))
    limit = int(raw) if raw.isdigit() else 0
    if not 1 <= limit <= MAX_LIST_LIMIT:
        raise MalformedRequestError(f"limit must be 1..{MAX_LIST_LIMIT}, not {raw!r}")
    return limit


async def _traced(fn: Callable[[Any], Awaitable[Json]], body: Any, operation: str,
                  request: web.Request) -> Json:
    """`fn(body)` under a `dedup` span, child of the request's `traceparent` header."""
    fields = body if isinstance(body, dict) else {}
    scene = fields.get("scene")
    msg_id = fields.get("msg_id")
    # aiohttp's headers are case-insensitive: `extract` finds `traceparent` as TRACEPARENT.
    with hop_span("dedup", destination=str(scene or ""), kind=SpanKind.SERVER,
                  msg_id=msg_id.upper() if isinstance(msg_id, str) and _MSG_ID.fullmatch(msg_id)
                  else None,
                  parent=extract(request.headers),
                  attributes={"ferry.dedup.operation": operation,
                              "ferry.dedup.scene": str(scene or "")}) as span:
        doc = await fn(body)
        span.set_attribute("ferry.outcome", str(doc.get("state", "ok")))
    return doc


def build_app(backend: Backend,
              auth: HttpAuth | None = None,
              guard: HttpGuard | None = None) -> web.Application:
    """The HTTP app; with `auth` (FERRY_AUTH=on) every route but the probes and the OpenAPI
    document needs a signed request and its permission (permissions.py)."""
    app = service_app(guard, errors_and_logs, openapi_document(backend.version),
                      ready=lambda: backend.ready, not_ready="not ready: starting or stopping",
                      stats=lambda: backend.stats_document(), auth=auth)
    metrics = app[METRICS]   # docs/metrics.md
    observe_counts(metrics, "ferry.dedup.claims", "outcome",
                   "Claims answered, per outcome (claimed, done, processing, unavailable)",
                   lambda: backend.stats_document()["claims"]["outcomes"], "{claim}")
    observe_counts(metrics, "ferry.dedup.confirms", "outcome", "Claims confirmed (ok, lost)",
                   lambda: backend.stats_document()["claims"]["confirms"], "{claim}")
    observe_counts(metrics, "ferry.dedup.releases", "outcome", "Claims released",
                   lambda: backend.stats_document()["claims"]["releases"], "{claim}")
    observe_counts(metrics, "ferry.dedup.reconciliations", "outcome", "Reconciliation runs",
                   lambda: backend.stats_document()["reconciliations"], "{run}")

    async def health(_: web.Request) -> web.Response:
        ok, doc = await backend.health()
        return json_response(doc, status=200 if ok else 503)

    def posted(fn: Callable[[Any], Awaitable[Json]], operation: str = ""
               ) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def route(request: web.Request) -> web.Response:
            body = await _body(request)
            if operation and TRACEPARENT_HEADER in request.headers and tracing().enabled:
                return json_response(await _traced(fn, body, operation, request))
            return json_response(await fn(body))
        return route

    async def confirm(body: Any) -> Json:
        return await backend.finish_claim(body, confirm=True)

    async def release(body: Any) -> Json:
        return await backend.finish_claim(body, confirm=False)

    async def ledger_by_key(request: web.Request) -> web.Response:
        scene, biz_key = request.query.get("scene"), request.query.get("biz_key")
        if not scene or not biz_key:
            raise MalformedRequestError("give both query parameters scene and biz_key")
        row = await backend.lookup_biz_key(scene, biz_key)
        if row is None:
            raise MessageNotFoundError(f"no ledger row for scene={scene}, biz_key={biz_key}")
        return json_response(row)

    async def ledger_by_msg_id(request: web.Request) -> web.Response:
        msg_id = request.match_info["msg_id"]
        if not _MSG_ID.fullmatch(msg_id):
            raise MalformedRequestError(f"msg_id must be 32 hex characters, not {msg_id!r}")
        rows = await backend.lookup_msg_id(msg_id.upper())
        if not rows:
            raise MessageNotFoundError(f"no ledger row for message {msg_id.upper()}")
        return json_response({"msg_id": msg_id.upper(), "rows": rows})

    async def list_reports(request: web.Request) -> web.Response:
        items, total = backend.reports(_limit(request))
        return json_response({"total": total, "reports": items})

    async def get_report(request: web.Request) -> web.Response:
        report_id = request.match_info["report_id"]
        report = backend.report(report_id)
        if report is None:
            raise MessageNotFoundError(f"no report {report_id!r} (kept: the newest only)")
        return json_response(report)

    app.router.add_get("/v1/health", health)
    app.router.add_post("/v1/claims", posted(backend.claim, "claim"))
    app.router.add_post("/v1/claims/confirm", posted(confirm, "confirm"))
    app.router.add_post("/v1/claims/release", posted(release, "release"))
    app.router.add_get("/v1/ledger", ledger_by_key)
    app.router.add_get("/v1/ledger/messages/{msg_id}", ledger_by_msg_id)
    app.router.add_post("/v1/reconcile", posted(backend.reconcile))
    app.router.add_get("/v1/reports", list_reports)
    app.router.add_get("/v1/reports/{report_id}", get_report)
    return app

