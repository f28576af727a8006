"""/v1/users and /v1/acl: identities and their permissions, kept in etcd.

Only derived signing keys reach namesrv (the CLI derives the key from the
secret on the caller's machine), so no secret travels or is stored. Every
route here needs admin `users` when auth is on (the auth middleware's route
table, ferry.auth.http), and with auth off every route here answers 403: the
identities a mesh will switch auth on with are made straight in etcd (`ferry
user add --bootstrap` for the first admin, `ferry user|acl ... --etcd` for the
rest), never by whoever reaches namesrv before the switch.

    GET    /v1/users                 the identities (never their keys)
    POST   /v1/users                 {access_key, signing_key (64 hex), description?, admin?}
    GET    /v1/users/{access_key}    one identity (never its key)
    DELETE /v1/users/{access_key}    remove an identity and its rules
    GET    /v1/acl                   every identity's rules
    GET    /v1/acl/{access_key}      one identity's rules
    PUT    /v1/acl/{access_key}      {rules: [...]}: replace them
    POST   /v1/acl/{access_key}      {rules: [...]}: add them (`ferry acl grant`)
    DELETE /v1/acl/{access_key}?resource=R[&effect=E]: drop the rules on R (all without R)
"""
from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from ferry.auth.acl import EFFECTS, Rule, admin_rules, parse_rules
from ferry.auth.credentials import SIGNING_KEY_BYTES, validate_access_key
from ferry.errors import AccessDeniedError, MalformedRequestError
from ferry.service.auth_registry import AuthRegistry
from ferry.service.errors import json_response

from ferry_namesrv.context import ctx
from ferry_namesrv.handlers.common import read_json

Handler = Callable[[web.Request], Awaitable[web.Response]]
_ACCESS_KEY = {"type": "string", "pattern": "^[A-Za-z0-9_-]{3,64}$"}


def _registry(request: web.Request) -> AuthRegistry:
    return AuthRegistry(ctx(request).registry)


def _object(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise MalformedRequestError("the body must be a JSON object")
    return body


def _signing_key(raw: object) -> bytes:
    if not isinstance(raw, str) or len(raw) != 2 * SIGNING_KEY_BYTES:
        raise MalformedRequestError("signing_key must be 64 hex characters (the derived key, "
                                    "never the secret)")
    try:
        return bytes.fromhex(raw)
    except ValueError:
        raise MalformedRequestError("signing_key must be hex") from None


def _rules_of(body: dict[str, Any]) -> tuple[Rule, ...]:
    return parse_rules(body.get("rules"))


async def list_users(request: web.Request) -> web.Response:
    users = await _registry(request).list_users()
    return json_response({"users": [u.public() for u in users]})


async def add_user(request: web.Request) -> web.Response:
    body = _object(await read_json(request))
    access_key = validate_access_key(body.get("access_key"))
    description = body.get("description", "")
    if not isinstance(description, str):
        raise MalformedRequestError("description must be a string")
    admin = body.get("admin", False)
    if type(admin) is not bool:
        raise MalformedRequestError("admin must be true or false")
    user = await _registry(request).add_user(
        access_key, _signing_key(body.get("signing_key")), description,
        admin_rules() if admin else ())
    return json_response(user.public(), status=201)


async def get_user(request: web.Request) -> web.Response:
    access_key = validate_access_key(request.match_info["access_key"])
    user = next((u for u in await _registry(request).list_users()
                 if u.access_key == access_key), None)
    if user is None:
        raise MalformedRequestError(f"no identity {access_key!r}")
    return json_response(user.public())


async def remove_user(request: web.Request) -> web.Response:
    access_key = validate_access_key(request.match_info["access_key"])
    if not await _registry(request).remove_user(access_key):
        raise MalformedRequestError(f"no identity {access_key!r}")
    return json_response({"deleted": access_key})


async def list_acl(request: web.Request) -> web.Response:
    reg = _registry(request)
    out = {u.access_key: [r.to_json() for r in await reg.get_rules(u.access_key)]
           for u in await reg.list_users()}
    return json_response({"acl": out})


async def get_acl(request: web.Request) -> web.Response:
    access_key = validate_access_key(request.match_info["access_key"])
    rules = await _registry(request).get_rules(access_key)
    return json_response({"access_key": access_key, "rules": [r.to_json() for r in rules]})


async def put_acl(request: web.Request) -> web.Response:
    access_key = validate_access_key(request.match_info["access_key"])
    rules = _rules_of(_object(await read_json(request)))
    await _registry(request).set_rules(access_key, rules)
    return json_response({"access_key": access_key, "rules": [r.to_json() for r in rules]})


async def grant_acl(request: web.Request) -> web.Response:
    access_key = validate_access_key(request.match_info["access_key"])
    added = _rules_of(_object(await read_json(request)))
    rules = await _registry(request).grant_rules(access_key, added)
    return json_response({"access_key": access_key, "rules": [r.to_json() for r in rules]})


async def revoke_acl(request: web.Request) -> web.Response:
    access_key = validate_access_key(request.match_info["access_key"])
    resource = request.query.get("resource")
    effect = request.query.get("effect")
    if effect is not None and effect not in EFFECTS:
        raise MalformedRequestError(f"effect must be one of {', '.join(EFFECTS)}")
    rules, kept = await _registry(request).revoke_rules(access_key, resource, effect)
    return json_response({"access_key": access_key, "removed": len(rules) - len(kept),
                          "rules": [r.to_json() for r in kept]})


#: Why these routes refuse with auth off: whoever reached namesrv before the switch to
#: FERRY_AUTH=on could otherwise make an identity (an admin) that outlives the switch.
AUTH_OFF_REFUSAL = (
    "identities and rules are managed through namesrv only with FERRY_AUTH=on: with auth off "
    "anyone who reaches namesrv could create an admin that outlives the switch. Before "
    "turning auth on, create them straight in etcd: `ferry user add ... --etcd HOST:PORT`, "
    "`ferry acl grant ... --etcd HOST:PORT` (docs/security.md, \"Turning auth on\")")


async def refuse_with_auth_off(request: web.Request) -> web.Response:
    raise AccessDeniedError(AUTH_OFF_REFUSAL)


def add_routes(app: web.Application, auth_on: bool) -> None:
    """The identity and rule routes; with auth off every one of them answers 403."""
    def h(handler: Handler) -> Handler:
        return handler if auth_on else refuse_with_auth_off

    app.router.add_get("/v1/users", h(list_users))
    app.router.add_post("/v1/users", h(add_user))
    app.router.add_get("/v1/users/{access_key}", h(get_user))
    app.router.add_delete("/v1/users/{access_key}", h(remove_user))
    app.router.add_get("/v1/acl", h(list_acl))
    app.router.add_get("/v1/acl/{access_key}", h(get_acl))
    app.router.add_put("/v1/acl/{access_key}", h(put_acl))
    app.router.add_post("/v1/acl/{access_key}", h(grant_acl))
    app.router.add_delete("/v1/acl/{access_key}", h(revoke_acl))


def _resp(description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {
        "schema": {"type": "object"}}}}


_RULE = {"type": "object", "required": ["effect", "resource", "actions"], "properties": {
    "effect": {"type": "string", "enum": list(EFFECTS)},
    "resource": {"type": "string",
                 "description": "topic:<glob>, group:<glob>, scene:<glob> or admin"},
    "actions": {"type": "array", "items": {"type": "string"}}}}
_RULES_BODY = {"required": True, "content": {"application/json": {"schema": {
    "type": "object", "required": ["rules"],
    "properties": {"rules": {"type": "array", "items": _RULE}}}}}}
_AK_PARAM = [{"name": "access_key", "in": "path", "required": True, "schema": _ACCESS_KEY}]
_ERR = {"400": _resp("invalid input"), "401": _resp("not authenticated"),
        "403": _resp("not permitted (admin users); with auth off, always"),
        "503": _resp("etcd unavailable, or the rules kept changing while written")}


def openapi_paths() -> dict[str, Any]:
    """The OpenAPI paths of these routes (docs/security.md, "Identities")."""
    user_body = {"required": True, "content": {"application/json": {"schema": {
        "type": "object", "required": ["access_key", "signing_key"], "properties": {
            "access_key": _ACCESS_KEY,
            "signing_key": {"type": "string", "pattern": "^[0-9a-fA-F]{64}$",
                            "description": "HMAC-SHA256(secret, 'ferry-signing-key/1\\n' + "
                                           "access_key), hex; never the secret"},
            "description": {"type": "string", "maxLength": 256},
            "admin": {"type": "boolean"}}}}}}
    return {
        "/v1/users": {
            "get": {"summary": "List identities", "operationId": "list_users",
                    "responses": {"200": _resp("identities"), **_ERR}},
            "post": {"summary": "Add an identity", "operationId": "add_user",
                     "requestBody": user_body,
                     "responses": {"201": _resp("added"), "409": _resp("exists"), **_ERR}}},
        "/v1/users/{access_key}": {
            "parameters": _AK_PARAM,
            "get": {"summary": "One identity (never its key)", "operationId": "get_user",
                    "responses": {"200": _resp("the identity"), **_ERR}},
            "delete": {"summary": "Remove an identity and its rules",
                       "operationId": "remove_user",
                       "responses": {"200": _resp("removed"), **_ERR}}},
        "/v1/acl": {"get": {"summary": "Every identity's rules", "operationId": "list_acl",
                            "responses": {"200": _resp("rules"), **_ERR}}},
        "/v1/acl/{access_key}": {
            "parameters": _AK_PARAM,
            "get": {"summary": "One identity's rules", "operationId": "get_acl",
                    "responses": {"200": _resp("rules"), **_ERR}},
            "put": {"summary": "Replace an identity's rules", "operationId": "put_acl",
                    "requestBody": _RULES_BODY, "responses": {"200": _resp("stored"), **_ERR}},
            "post": {"summary": "Add rules to an identity", "operationId": "grant_acl",
                     "requestBody": _RULES_BODY, "responses": {"200": _resp("stored"), **_ERR}},
            "delete": {"summary": "Drop an identity's rules on a resource (all without one)",
                       "operationId": "revoke_acl",
                       "parameters": [
                           {"name": "resource", "in": "query", "required": False,
                            "schema": {"type": "string"}},
                           {"name": "effect", "in": "query", "required": False,
                            "schema": {"type": "string", "enum": list(EFFECTS)}}],
                       "responses": {"200": _resp("stored"), **_ERR}}},
    }
