"""The OpenAPI 3 document of the delay scheduler's HTTP API, served at /openapi.json."""
from __future__ import annotations

from typing import Any

from ferry.service.openapi import document, stats_path
from ferry.service.openapi import error_response as _error
from ferry.service.openapi import json_response as _json

_LEADER = {"leader": {"type": "string", "description": "a standby's 503: the leader's HTTP "
                                                      "address, where to ask again"}}


def openapi_document(version: str) -> dict[str, Any]:
    paths: dict[str, Any] = {
        **stats_path("Role, pending, due in the next minute, delivered, duplicates after a "
                     "crash, cancelled, lateness histogram"),
        "/v1/delayed/{msg_id}/cancel": {"post": {
            "summary": "Cancel a pending delayed message: it is never delivered",
            "operationId": "cancel_delayed",
            "parameters": [{"name": "msg_id", "in": "path", "required": True,
                            "schema": {"type": "string", "pattern": "^[0-9A-Fa-f]{32}$"}}],
            "responses": {
                "200": _json({"type": "object", "properties": {
                    "msg_id": {"type": "string"}, "cancelled": {"type": "boolean"},
                    "due_ms": {"type": "integer"}}}, "cancelled (in etcd first)"),
                "400": _error("msg_id is not 32 hex characters"),
                "404": _error("MessageNotFoundError (12): no such delayed message"),
                "409": _error("AlreadyDeliveredError (21): delivered before the cancel"),
                "503": _error("a standby (see `leader`), or not ready")}}},
    }
    return document("Ferry delay scheduler", version,
                    "Delayed delivery: statistics and cancel. Messages arrive through the "
                    "brokers' %SCHEDULE% topic, not over HTTP.", paths,
                    ready="Serving (leader or standby)",
                    not_ready="recovering or stopping", error_fields=_LEADER)
