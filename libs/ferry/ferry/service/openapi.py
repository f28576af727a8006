"""The OpenAPI 3 document every Ferry HTTP API serves at /openapi.json, built from shared parts.

A service lists its own paths (with `json_response` and `error_response` for
the answers); `document` adds the probe routes (/healthz, /readyz,
/openapi.json), the error schema of `ferry.service.errors`, the title and
version; `document_auth` adds the signature headers and 401/403 when auth is on.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ferry.auth.http import HEADER_ACCESS_KEY, HEADER_NONCE, HEADER_SIGNATURE, HEADER_TIMESTAMP
from ferry.service.auth import OPEN_PATHS

Doc = dict[str, Any]

#: `{"error": {"code", "type", "message"}}` (ferry.service.errors), as a schema.
ERROR_FIELDS: Mapping[str, Doc] = {
    "code": {"type": "integer", "description": "Ferry error code (ferry.errors)"},
    "type": {"type": "string", "description": "error class, e.g. MalformedRequestError"},
    "message": {"type": "string"}}


def error_schema(extra: Mapping[str, Doc] | None = None) -> Doc:
    """The schema of the JSON error body; `extra` fields some errors add (a standby's leader)."""
    return {"type": "object", "required": ["error"],
            "properties": {"error": {"type": "object", "required": ["code", "type", "message"],
                                     "properties": {**ERROR_FIELDS, **(extra or {})}}}}


def json_response(schema: Doc, description: str) -> Doc:
    """An answer with a JSON body of `schema`."""
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def error_response(description: str) -> Doc:
    """An answer with the JSON error body."""
    return json_response({"$ref": "#/components/schemas/Error"}, description)


def probe_paths(ready: str, not_ready: str = "starting or stopping") -> Doc:
    """/healthz, /readyz (summary `ready`; 503 `not_ready`), /openapi.json and /metrics."""
    obj = {"type": "object"}
    return {
        "/healthz": {"get": {"summary": "The process answers", "operationId": "healthz",
                             "responses": {"200": json_response(obj, "alive")}}},
        "/readyz": {"get": {"summary": ready, "operationId": "readyz",
                            "responses": {"200": json_response(obj, "ready"),
                                          "503": error_response(not_ready)}}},
        "/openapi.json": {"get": {"summary": "This document", "operationId": "openapi",
                                  "responses": {"200": json_response(obj, "OpenAPI 3")}}},
        "/metrics": {"get": {"summary": "Metrics in Prometheus's text format (docs/metrics.md)",
                             "operationId": "metrics", "responses": {"200": {
                                 "description": "text/plain; version=0.0.4"}}}},
    }


def stats_path(summary: str) -> Doc:
    """/v1/stats: the service's statistics (and its HTTP limits under `limits`)."""
    return {"/v1/stats": {"get": {"summary": summary, "operationId": "stats", "responses": {
        "200": json_response({"type": "object"}, "statistics")}}}}


def document(title: str, version: str, description: str, paths: Mapping[str, Doc], *,
             ready: str, not_ready: str = "starting or stopping",
             schemas: Mapping[str, Doc] | None = None,
             error_fields: Mapping[str, Doc] | None = None) -> Doc:
    """A service's whole document: its `paths` after the probe routes, the error schema."""
    return {"openapi": "3.0.3",
            "info": {"title": title, "version": version, "description": description},
            "paths": {**probe_paths(ready, not_ready), **paths},
            "components": {"schemas": {"Error": error_schema(error_fields), **(schemas or {})}}}


_AUTH_ERROR = {"description": "", "content": {"application/json": {"schema": {
    "type": "object", "required": ["error"], "properties": {"error": {"type": "object"}}}}}}


def document_auth(document: dict[str, Any],
                  open_paths: frozenset[str] = OPEN_PATHS) -> dict[str, Any]:
    """`document` (an OpenAPI 3 document) with the signature headers as its security scheme
    and the 401 / 403 answers on every operation but the open paths (auth on)."""
    doc = {**document, "components": {**document.get("components", {})}}
    doc["components"]["securitySchemes"] = {"ferrySignature": {
        "type": "apiKey", "in": "header", "name": HEADER_SIGNATURE,
        "description": f"with {HEADER_ACCESS_KEY}, {HEADER_TIMESTAMP} and {HEADER_NONCE}: "
                       "HMAC-SHA256 of the request (docs/security.md, HTTP APIs)"}}
    paths: dict[str, Any] = {}
    for path, item in document.get("paths", {}).items():
        if path in open_paths:
            paths[path] = item
            continue
        paths[path] = {key: _secured(op) if isinstance(op, dict) and "responses" in op else op
                       for key, op in item.items()}
    doc["paths"] = paths
    return doc


def _secured(operation: dict[str, Any]) -> dict[str, Any]:
    responses = dict(operation["responses"])
    responses.setdefault("401", {**_AUTH_ERROR, "description": "not authenticated "
                                 "(AuthenticationError)"})
    responses.setdefault("403", {**_AUTH_ERROR, "description": "not permitted "
                                 "(AccessDeniedError)"})
    return {**operation, "responses": responses, "security": [{"ferrySignature": []}]}


