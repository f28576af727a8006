"""The OpenAPI 3 document of the namesrv HTTP API, served at /openapi.json."""
from __future__ import annotations

from typing import Any

from ferry.routing import MAX_QUEUES, MIN_QUEUES
from ferry.routing.models import (
    CONSUME_FROM,
    DEFAULT_RETRY_BACKOFF_MS,
    MAX_PRIORITY_LEVELS,
    MAX_RETENTION_BYTES,
    MAX_RETENTION_MS,
    MAX_RETRY,
    MAX_RETRY_BACKOFF_MS,
    MAX_RETRY_BACKOFF_STEPS,
    MIN_PRIORITY_LEVELS,
    MIN_RETENTION_BYTES,
    MIN_RETENTION_MS,
    TOPIC_PERMS,
    TOPIC_TYPES,
)
from ferry.service.openapi import document, stats_path
from ferry.service.openapi import error_response as _error
from ferry.service.openapi import json_response as _json

from ferry_namesrv.handlers import users

_NAME = {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,127}$"}
_TOPIC_NAME = {"type": "string", "pattern": "^([A-Za-z0-9_-]{1,127}|%(RETRY|DLQ|SYS)%[A-Za-z0-9_-]{1,127})$"}


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


_PRIORITY_LEVELS = {
    "type": "integer", "minimum": MIN_PRIORITY_LEVELS, "maximum": MAX_PRIORITY_LEVELS,
    "default": 1, "description": "priority levels (at most queues): queue q of a broker's Q "
                                 "serves level q * priority_levels // Q; higher drains first"}

_SCHEMAS: dict[str, Any] = {
    "TopicConfig": {
        "type": "object", "additionalProperties": False, "required": ["name"],
        "properties": {
            "name": _TOPIC_NAME,
            "queues": {"type": "integer", "minimum": MIN_QUEUES, "maximum": MAX_QUEUES,
                       "default": 8, "description": "queues on each serving broker group"},
            "perm": {"type": "string", "enum": list(TOPIC_PERMS), "default": "rw"},
            "type": {"type": "string", "enum": list(TOPIC_TYPES), "default": "normal"},
            "brokers": {"type": "array", "items": _NAME, "uniqueItems": True, "default": [],
                        "description": "broker groups serving the topic; empty = every master"},
            "priority_levels": _PRIORITY_LEVELS,
            "retention_ms": {"type": "integer", "nullable": True, "minimum": MIN_RETENTION_MS,
                             "maximum": MAX_RETENTION_MS,
                             "description": "the topic's own time retention; absent = the "
                                            "broker's retention_hours"},
            "retention_bytes": {"type": "integer", "nullable": True,
                                "minimum": MIN_RETENTION_BYTES,
                                "maximum": MAX_RETENTION_BYTES,
                                "description": "bytes kept per queue (Kafka's retention.bytes);"
                                               " absent = no size limit"}}},
    "GroupConfig": {
        "type": "object", "additionalProperties": False, "required": ["name"],
        "properties": {
            "name": _NAME,
            "retry_max": {"type": "integer", "minimum": 0, "maximum": MAX_RETRY, "default": 16,
                          "description": "redeliveries of a nacked message before the "
                                         "dead-letter topic (max_reconsume_times)"},
            "max_reconsume_times": {"type": "integer", "minimum": 0, "maximum": MAX_RETRY,
                                    "description": "alias of retry_max on input (not both)"},
            "retry_backoff_ms": {
                "type": "array", "minItems": 1, "maxItems": MAX_RETRY_BACKOFF_STEPS,
                "items": {"type": "integer", "minimum": 0, "maximum": MAX_RETRY_BACKOFF_MS},
                "default": list(DEFAULT_RETRY_BACKOFF_MS),
                "description": "wait before redelivery n (1-based); later ones wait the last"},
            "broadcast_allowed": {"type": "boolean", "default": True},
            "consume_from": {"type": "string", "enum": list(CONSUME_FROM), "default": "latest"},
            "consume_timestamp_ms": {"type": "integer", "minimum": 0, "default": 0}}},
    "Broker": {
        "type": "object",
        "properties": {
            "cluster": _NAME, "name": _NAME,
            "id": {"type": "integer", "description": "0 = master"},
            "addr": {"type": "string", "description": "wire address host:port"},
            "repl_addr": {"type": "string"}, "http_addr": {"type": "string"},
            "topics": {"type": "object", "additionalProperties": {"type": "integer"}}}},
    "Route": {
        "type": "object", "required": ["topic", "type", "perm", "brokers"],
        "properties": {
            "topic": _TOPIC_NAME,
            "type": {"type": "string", "enum": list(TOPIC_TYPES)},
            "perm": {"type": "string", "enum": list(TOPIC_PERMS)},
            "brokers": {"type": "array", "items": {
                "type": "object",
                "properties": {
                    "name": _NAME, "cluster": _NAME,
                    "master": {"type": "string", "nullable": True,
                               "description": "master wire address; null while it is down"},
                    "slaves": {"type": "array", "items": {"type": "string"}},
                    "queues": {"type": "integer"},
                    "perm": {"type": "string", "enum": list(TOPIC_PERMS)}}}},
            "priority_levels": _PRIORITY_LEVELS}},
}

_BAD = _error("invalid name or body")
_BUSY = _error("not ready, or etcd unavailable; retry")


def _crud(kind: str, schema: str, not_found: str) -> dict[str, Any]:
    one = f"/v1/{kind}s/{{{kind}}}"
    param = [{"name": kind, "in": "path", "required": True, "schema": _NAME if kind == "group"
              else _TOPIC_NAME}]
    body = {"required": True, "content": {"application/json": {"schema": _ref(schema)}}}
    return {
        f"/v1/{kind}s": {
            "get": {"summary": f"List {kind} configs", "operationId": f"list_{kind}s",
                    "responses": {"200": _json({"type": "object", "properties": {
                        f"{kind}s": {"type": "array", "items": _ref(schema)}}}, "all"),
                        "503": _BUSY}},
            "post": {"summary": f"Create a {kind}", "operationId": f"create_{kind}",
                     "requestBody": body,
                     "responses": {"201": _json(_ref(schema), "created"), "400": _BAD,
                                   "409": _error("already exists"), "503": _BUSY}}},
        one: {
            "parameters": param,
            "get": {"summary": f"One {kind} config", "operationId": f"get_{kind}",
                    "responses": {"200": _json(_ref(schema), kind), "400": _BAD,
                                  "404": _error(not_found), "503": _BUSY}},
            "put": {"summary": f"Create or replace a {kind}", "operationId": f"put_{kind}",
                    "requestBody": body,
                    "responses": {"200": _json(_ref(schema), "stored"), "400": _BAD,
                                  "503": _BUSY}},
            "delete": {"summary": f"Delete a {kind}", "operationId": f"delete_{kind}",
                       "responses": {"200": _json({"type": "object", "properties": {
                           "deleted": {"type": "string"}}}, "deleted"), "400": _BAD,
                           "404": _error(not_found), "503": _BUSY}}},
    }


def _resets_path() -> dict[str, Any]:
    """The record of a group's offset resets (handlers/resets.py)."""
    queue = {"type": "object", "properties": {
        "broker": {"type": "string"}, "queue_id": {"type": "integer"},
        "from": {"type": "integer"}, "to": {"type": "integer"}}}
    record = {"type": "object", "properties": {
        "topic": _TOPIC_NAME, "to": {"type": "string", "enum": [
            "earliest", "latest", "time", "offset", "shift"]},
        "value": {"type": "integer"}, "force": {"type": "boolean"},
        "queues": {"type": "array", "items": queue}}}
    stamped = {"allOf": [record, {"type": "object", "properties": {
        "group": _NAME, "who": {"type": "string", "nullable": True},
        "at_ms": {"type": "integer"}}}]}
    return {
        "parameters": [{"name": "group", "in": "path", "required": True, "schema": _NAME}],
        "get": {"summary": "The group's offset resets, newest first (at most 50)",
                "operationId": "list_group_resets",
                "responses": {"200": _json({"type": "object", "properties": {
                    "resets": {"type": "array", "items": stamped}}}, "resets"),
                    "400": _BAD, "503": _BUSY}},
        "post": {"summary": "Record an offset reset (who and when are stamped here)",
                 "operationId": "record_group_reset",
                 "requestBody": {"required": True,
                                 "content": {"application/json": {"schema": record}}},
                 "responses": {"201": _json(stamped, "recorded"), "400": _BAD,
                               "503": _BUSY}}}


def openapi_document(version: str) -> dict[str, Any]:
    """The whole document; `version` is the namesrv package version."""
    paths: dict[str, Any] = {
        "/v1/routes/{topic}": {"get": {
            "summary": "Route of a topic: the broker groups serving it and their queues",
            "operationId": "get_route",
            "parameters": [
                {"name": "topic", "in": "path", "required": True, "schema": _TOPIC_NAME},
                {"name": "create", "in": "query", "required": False,
                 "schema": {"type": "string", "enum": ["0", "1", "true", "false"]},
                 "description": "create the topic with the default queue count if unknown "
                                "(when the namesrv allows auto-create)"}],
            "responses": {"200": _json(_ref("Route"), "the route"), "400": _BAD,
                          "404": _error("unknown topic"), "503": _BUSY}}},
        "/v1/brokers": {"get": {
            "summary": "Live brokers (each under its etcd lease)", "operationId": "list_brokers",
            "responses": {"200": _json({"type": "object", "properties": {
                "brokers": {"type": "array", "items": _ref("Broker")},
                "revision": {"type": "integer"}}}, "brokers"), "503": _BUSY}}},
        "/v1/whoami": {"get": {
            "summary": "The access key the request was signed with (null with auth off)",
            "operationId": "whoami",
            "responses": {"200": _json({"type": "object", "properties": {
                "access_key": {"type": "string", "nullable": True},
                "auth": {"type": "boolean"}}}, "who"), "401": _error("not authenticated")}}},
        **stats_path("The HTTP limits and how often each refused"),
        "/console": {"get": {"summary": "Redirect to the web console (CONSOLE_URL)",
                             "operationId": "console",
                             "responses": {"302": {"description": "to ferry-console"}}}},
    }
    paths.update(_crud("topic", "TopicConfig", "unknown topic"))
    paths.update(_crud("group", "GroupConfig", "unknown group"))
    paths["/v1/groups/{group}/resets"] = _resets_path()
    paths.update(users.openapi_paths())
    return document("Ferry namesrv", version,
                    "Topic routes, topic and group config, and live brokers, answered from a "
                    "cache that watches etcd.", paths, ready="Routes are loaded from etcd",
                    not_ready="not ready, or etcd unavailable; retry", schemas=_SCHEMAS)
