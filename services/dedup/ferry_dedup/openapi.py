"""The OpenAPI 3 document of the dedup service's HTTP API, served at /openapi.json."""
from __future__ import annotations

from typing import Any

from ferry.service.openapi import document, stats_path
from ferry.service.openapi import error_response as _error
from ferry.service.openapi import json_response as _json

_STR = {"type": "string"}
_INT = {"type": "integer"}
_CLAIM_KEYS = {"scene": {**_STR, "description": "1..64 of [A-Za-z0-9_.-]"},
               "biz_key": {**_STR, "description": "the business key (message key, else id)"}}
_CLAIM_REQ = {"type": "object", "required": ["scene", "biz_key"],
              "properties": {**_CLAIM_KEYS, "lease_ms": {**_INT, "minimum": 100,
                                                         "maximum": 3_600_000}}}
_CLAIM = {"type": "object", "required": ["state"], "properties": {
    "state": {"type": "string", "enum": ["claimed", "done", "processing"],
              "description": "claimed: run, then confirm or release with the token; done: a "
                             "duplicate, skip and acknowledge; processing: retry later"},
    "token": {**_STR, "description": "only when claimed"}, "lease_ms": _INT, **_CLAIM_KEYS}}
_FINISH_REQ = {"type": "object", "required": ["scene", "biz_key", "token"],
               "properties": {**_CLAIM_KEYS, "token": _STR}}
_ROW = {"type": "object", "properties": {
    "scene": _STR, "biz_key": _STR, "msg_id": _STR, "topic": _STR, "group": _STR,
    "queue_id": _INT, "queue_offset": _INT, "recorded_ms": _INT,
    "amount": {**_INT, "nullable": True}}}
_RECONCILE_REQ = {"type": "object", "required": ["topic", "group", "from_ms", "to_ms"],
                  "properties": {"topic": _STR, "group": _STR,
                                 "scene": {**_STR, "description": "default: the group"},
                                 "from_ms": _INT, "to_ms": {**_INT, "description": "exclusive"},
                                 "grace_ms": {**_INT, "description": "default 60000"}}}
_REPORT = {"type": "object", "description": "see docs/idempotence.md, Reconciliation",
           "properties": {
               "id": _STR, "trigger": {"type": "string", "enum": ["api", "schedule"]},
               "topic": _STR, "group": _STR, "scene": _STR, "from_ms": _INT, "to_ms": _INT,
               "grace_ms": _INT, "margin_ms": _INT, "clock_skew_ms": _INT,
               "started_ms": _INT, "finished_ms": _INT, "complete": {"type": "boolean"},
               "truncated": {"type": "boolean"}, "errors": {"type": "array", "items": _STR},
               "counts": {"type": "object", "properties": {
                   k: _INT for k in ("stored", "ledger_rows", "recorded", "missing", "pending",
                                     "orphans", "orphans_unverified", "duplicates_prevented")}},
               "samples": {"type": "object", "description": "up to sample_limit items per "
                                                            "section"},
               "sample_limit": _INT}}


def _post(summary: str, op: str, request: dict[str, Any], answer: dict[str, Any],
          *errors: tuple[str, str], traced: bool = False) -> dict[str, Any]:
    responses = {"200": _json(answer, "done"), **{c: _error(d) for c, d in errors}}
    post: dict[str, Any] = {"summary": summary, "operationId": op,
                            "requestBody": {"required": True, "content": {
                                "application/json": {"schema": request}}},
                            "responses": responses}
    if traced:
        post["parameters"] = [_TRACEPARENT]
    return {"post": post}


def _get(summary: str, op: str, answer: dict[str, Any], *errors: tuple[str, str],
         parameters: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    responses = {"200": _json(answer, "the answer"), **{c: _error(d) for c, d in errors}}
    op_doc: dict[str, Any] = {"summary": summary, "operationId": op, "responses": responses}
    if parameters:
        op_doc["parameters"] = parameters
    return {"get": op_doc}


#: The W3C trace context a claim request may carry: the request then gets a `dedup` span.
_TRACEPARENT = {"name": "traceparent", "in": "header", "required": False, "schema": _STR,
                "description": "W3C trace context of a traced message (docs/tracing.md): "
                               "the check becomes a `dedup` span of that trace"}


def _param(name: str, where: str = "query", required: bool = True) -> dict[str, Any]:
    return {"name": name, "in": where, "required": required, "schema": _STR}


BAD = ("400", "MalformedRequestError (4): bad input")
DOWN = ("503", "StoreUnavailableError (19): Redis or the ledger database is unreachable")
GONE = ("404", "MessageNotFoundError (12): nothing found")
#: With auth on: the caller lacks `claim` on the body's scene (permissions.py).
NO_SCENE = ("403", "AccessDeniedError (27): needs claim on scene:<the body's scene>")


def openapi_document(version: str) -> dict[str, Any]:
    obj = {"type": "object"}
    paths: dict[str, Any] = {
        "/v1/health": _get("Redis and the ledger database reachable", "health", obj,
                           ("503", "one of them is not (the body says which)")),
        "/v1/claims": _post("Claim (scene, biz_key) on Redis", "claim", _CLAIM_REQ, _CLAIM,
                            BAD, NO_SCENE, DOWN, traced=True),
        "/v1/claims/confirm": _post("Mark our claim done (kept for the done TTL)", "confirm",
                                    _FINISH_REQ, {"type": "object", "properties": {
                                        "ok": {"type": "boolean"}}}, BAD, NO_SCENE, DOWN,
                                    traced=True),
        "/v1/claims/release": _post("Delete our claim after a failure", "release",
                                    _FINISH_REQ, {"type": "object", "properties": {
                                        "ok": {"type": "boolean"}}}, BAD, NO_SCENE, DOWN,
                                    traced=True),
        "/v1/ledger": _get("The ledger row of (scene, biz_key)", "ledger_by_biz_key", _ROW,
                           BAD, GONE, DOWN,
                           parameters=[_param("scene"), _param("biz_key")]),
        "/v1/ledger/messages/{msg_id}": _get(
            "Every ledger row of a message id", "ledger_by_msg_id",
            {"type": "object", "properties": {"msg_id": _STR,
                                              "rows": {"type": "array", "items": _ROW}}},
            BAD, GONE, DOWN, parameters=[_param("msg_id", "path")]),
        "/v1/reconcile": _post("Reconcile a topic's stored messages with the ledger",
                               "reconcile", _RECONCILE_REQ, _REPORT, BAD,
                               ("404", "TopicNotFoundError (7)"), DOWN),
        "/v1/reports": _get("Kept reports, newest first (no samples)", "list_reports",
                            {"type": "object", "properties": {
                                "total": _INT, "reports": {"type": "array",
                                                           "items": _REPORT}}}, BAD,
                            parameters=[{"name": "limit", "in": "query", "schema": {
                                "type": "integer", "minimum": 1, "maximum": 100,
                                "default": 20}}]),
        "/v1/reports/{report_id}": _get("One whole report", "get_report", _REPORT, GONE,
                                        parameters=[_param("report_id", "path")]),
        **stats_path("Claims by outcome, look-ups, reconciliations, the last report's counts"),
    }
    return document("Ferry dedup", version,
                    "Idempotence over HTTP: Redis claims, ledger look-ups, reconciliation of "
                    "the ledger against the brokers.", paths, ready="Started")
