"""/v1/groups/{group}/resets: the record of a group's offset resets (issue 25).

A client that reset a group's offsets (`ferry group reset-offsets`, the console's
form: COMMIT_OFFSET with `reset` at each broker) posts what it did here; namesrv
stamps who (the signing identity, null with auth off) and when, and keeps it in
etcd (`ferry.routing.reset_log`). Posting needs `reset` on the group, like the
reset itself; reading it, `reset` or `consume` on the group, or admin read.
"""
from __future__ import annotations

import time
from typing import Any

from aiohttp import web
from ferry.errors import MalformedRequestError
from ferry.names import validate_group, validate_topic
from ferry.routing.reset_log import add_reset, list_resets
from ferry.service.auth import access_key_of
from ferry.service.errors import json_response

from ferry_namesrv.context import ctx
from ferry_namesrv.handlers.common import read_json

#: Queue lines one record may hold (a topic has at most this many queues in all).
MAX_RECORD_QUEUES = 4096
_TARGETS = frozenset({"earliest", "latest", "time", "offset", "shift"})


def _int(d: dict[str, Any], name: str) -> int:
    value = d.get(name)
    if type(value) is not int or not -(1 << 63) <= value < (1 << 63):
        raise MalformedRequestError(f"{name!r} must be a 64-bit integer, not {value!r}")
    return value


def _queue(q: Any) -> dict[str, Any]:
    if not isinstance(q, dict) or not isinstance(q.get("broker"), str) \
            or not 0 < len(q["broker"]) <= 127:
        raise MalformedRequestError("each queue needs broker (a name), queue_id, from and to")
    return {"broker": q["broker"], "queue_id": _int(q, "queue_id"), "from": _int(q, "from"),
            "to": _int(q, "to")}


def parse_record(body: Any) -> dict[str, Any]:
    """The reset a client reports, checked field by field (nothing else is kept)."""
    if not isinstance(body, dict):
        raise MalformedRequestError("the body must be a JSON object")
    if body.get("to") not in _TARGETS:
        raise MalformedRequestError(f"'to' must be one of {sorted(_TARGETS)}")
    queues = body.get("queues")
    if not isinstance(queues, list) or len(queues) > MAX_RECORD_QUEUES:
        raise MalformedRequestError(f"'queues' must be a list of at most {MAX_RECORD_QUEUES}")
    return {"topic": validate_topic(body.get("topic")), "to": body["to"],
            "value": _int(body, "value"), "force": body.get("force") is True,
            "queues": [_queue(q) for q in queues]}


async def post_reset(request: web.Request) -> web.Response:
    c = ctx(request)
    group = validate_group(request.match_info["group"])
    record = parse_record(await read_json(request))
    record.update(group=group, who=access_key_of(request), at_ms=int(time.time() * 1000))
    await add_reset(c.registry, group, record)
    return json_response(record, status=201)


async def get_resets(request: web.Request) -> web.Response:
    group = validate_group(request.match_info["group"])
    return json_response({"resets": await list_resets(ctx(request).registry, group)})
