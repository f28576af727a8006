"""The OpenAPI 3 document of the delay scheduler's HTTP API, served at /openapi.json."""
from __future__ import annotations

from typing import Any

_ERROR = {
    "type": "object", "required": ["error"],
    "properties": {"error": {
        "type": "object", "required": ["code", "type", "message"],
        "properties": {
            "code": {"type": "integer", "description": "Ferry error code (ferry.errors)"},
            "type": {"type": "string", "description": "error class, e.g. AlreadyDeliveredError"},
            "message": {"type": "string"},
            "leader": {"type": "string", "description": "a standby's 503: the leader's HTTP "
                                                        "address, where to ask again"}}}}}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _error(description: str) -> dict[str, Any]:
    return _json({"$ref": "#/components/schemas/Error"}, description)


def openapi_document(version: str) -> dict[str, Any]:
    paths: dict[str, Any] = {
        "/healthz": {"get": {"summary": "The process answers", "operationId": "healthz",
                             "responses": {"200": _json({"type": "object"}, "alive")}}},
        "/readyz": {"get": {"summary": "Serving (leader or standby)",
                            "operationId": "readyz",
                            "responses": {"200": _json({"type": "object"}, "ready"),
                                          "503": _error("recovering or stopping")}}},
        "/v1/stats": {"get": {
            "summary": "Role, pending, due in the next minute, delivered, duplicates after a "
                       "crash, cancelled, lateness histogram", "operationId": "stats",
            "responses": {"200": _json({"type": "object"}, "statistics")}}},
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
        "/openapi.json": {"get": {"summary": "This document", "operationId": "openapi",
                                  "responses": {"200": _json({"type": "object"}, "OpenAPI 3")}}},
    }
    return {"openapi": "3.0.3",
            "info": {"title": "Ferry delay scheduler", "version": version,
                     "description": "Delayed delivery: statistics and cancel. Messages arrive "
                                    "through the brokers' %SCHEDULE% topic, not over HTTP."},
            "paths": paths, "components": {"schemas": {"Error": _ERROR}}}
