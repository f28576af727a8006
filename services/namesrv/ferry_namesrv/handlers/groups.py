"""/v1/groups: group configs. Reads come from the cache, writes go to etcd.

Every write waits until this instance's cache has seen it, so a client that
writes and then reads through the same namesrv sees its write.
"""
from __future__ import annotations

import time
from dataclasses import replace

from aiohttp import web
from ferry.errors import GroupNotFoundError
from ferry.names import validate_group
from ferry.routing import GroupConfig
from ferry.service.errors import json_response

from ferry_namesrv.context import ctx
from ferry_namesrv.handlers.common import read_json, visible


async def list_groups(request: web.Request) -> web.Response:
    cache = ctx(request).ready_cache()
    return json_response({"groups": [t.to_dict() for _, t in sorted(cache.groups.items())]})


async def create_group(request: web.Request) -> web.Response:
    c = ctx(request)
    c.ready_cache()  # a write is confirmed through the cache
    cfg = GroupConfig.from_dict(await read_json(request), strict=True)
    if not cfg.created_ms:   # brokers compare it with their offset tables (issue 16)
        cfg = replace(cfg, created_ms=int(time.time() * 1000))
    await visible(c.cache, await c.registry.put_group(cfg, create_only=True))
    return json_response(cfg.to_dict(), status=201)


async def get_group(request: web.Request) -> web.Response:
    name = validate_group(request.match_info["group"])
    cfg = ctx(request).ready_cache().groups.get(name)
    if cfg is None:
        raise GroupNotFoundError(f"group {name!r} does not exist")
    return json_response(cfg.to_dict())


async def put_group(request: web.Request) -> web.Response:
    c = ctx(request)
    c.ready_cache()  # a write is confirmed through the cache
    name = validate_group(request.match_info["group"])
    cfg = GroupConfig.from_dict(await read_json(request), strict=True, name=name)
    old = c.cache.groups.get(name)
    if not cfg.created_ms:   # a change keeps the creation time; a first PUT creates it now
        cfg = replace(cfg, created_ms=old.created_ms if old is not None and old.created_ms
                      else int(time.time() * 1000))
    await visible(c.cache, await c.registry.put_group(cfg))
    return json_response(cfg.to_dict())


async def delete_group(request: web.Request) -> web.Response:
    c = ctx(request)
    c.ready_cache()  # a write is confirmed through the cache
    name = validate_group(request.match_info["group"])
    revision = await c.registry.delete_group(name)
    if not revision:
        raise GroupNotFoundError(f"group {name!r} does not exist")
    await visible(c.cache, revision)
    return json_response({"deleted": name})
