"""The OpenAPI 3 document of the txn-checker's HTTP API, served at /openapi.json."""
from __future__ import annotations

from typing import Any

from ferry.service.openapi import document, stats_path
from ferry.service.openapi import error_response as _error
from ferry.service.openapi import json_response as _json

_TXN = {
    "type": "object", "required": ["msg_id", "state"],
    "properties": {
        "msg_id": {"type": "string", "description": "the transaction id (32 hex)"},
        "state": {"type": "string",
                  "enum": ["open", "discarded", "committed", "rolled_back"]},
        "group": {"type": "string"}, "broker": {"type": "string"},
        "topic": {"type": "string", "description": "the real topic"},
        "half_offset": {"type": "integer"}, "store_ms": {"type": "integer", "nullable": True},
        "immunity_ms": {"type": "integer"},
        "checks": {"type": "integer", "nullable": True},
        "next_check_ms": {"type": "integer"},
        "discarded_ms": {"type": "integer"},
        "by": {"type": "string", "nullable": True,
               "description": "recently resolved: producer, check or discarded"}}}


def openapi_document(version: str) -> dict[str, Any]:
    txn_ref = {"$ref": "#/components/schemas/Transaction"}
    paths: dict[str, Any] = {
        **stats_path("open, checked, committed_by_check, rolled_back_by_check, discarded, "
                     "scan positions per broker, role (leader or standby), leader, epoch"),
        "/v1/transactions": {"get": {
            "summary": "Open or discarded transactions", "operationId": "list_transactions",
            "parameters": [
                {"name": "state", "in": "query", "schema": {
                    "type": "string", "enum": ["open", "discarded"], "default": "open"}},
                {"name": "limit", "in": "query", "schema": {
                    "type": "integer", "minimum": 1, "maximum": 1000, "default": 100}}],
            "responses": {
                "200": _json({"type": "object", "properties": {
                    "state": {"type": "string"}, "total": {"type": "integer"},
                    "transactions": {"type": "array", "items": txn_ref}}}, "the list"),
                "400": _error("bad state or limit")}}},
        "/v1/transactions/{msg_id}": {"get": {
            "summary": "One transaction: open, discarded or recently resolved",
            "operationId": "describe_transaction",
            "parameters": [{"name": "msg_id", "in": "path", "required": True,
                            "schema": {"type": "string", "pattern": "^[0-9A-Fa-f]{32}$"}}],
            "responses": {"200": _json(txn_ref, "the transaction"),
                          "400": _error("msg_id is not 32 hex characters"),
                          "404": _error("MessageNotFoundError (12): not known to the checker")}}},
    }
    return document("Ferry txn-checker", version,
                    "Resolves transactional half messages left undecided: statistics and the "
                    "open and discarded transactions.", paths,
                    ready="Checkpoint loaded (leading or standing by)", schemas={"Transaction": _TXN})
