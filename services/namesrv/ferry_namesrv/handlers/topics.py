"""/v1/topics: topic configs. Reads come from the cache, writes go to etcd.

Every write waits until this instance's cache has seen it, so a client that
writes and then reads through the same namesrv sees its write.

Internal topics (`%RETRY%<group>`, `%SCHEDULE%`, `%SYS%...`: a name with `%`)
are read here but never created, changed or deleted through this API
(InvalidNameError, 400): the brokers that own them write their configs to etcd
themselves (ferry_broker.registration), and an outside write could replace
what they serve (issue 16).
"""
from __future__ import annotations

from aiohttp import web
from ferry.errors import InvalidNameError, TopicNotFoundError
from ferry.names import is_internal, validate_topic
from ferry.routing import TopicConfig
from ferry.service.errors import json_response

from ferry_namesrv.context import ctx
from ferry_namesrv.handlers.common import read_json, visible


async def list_topics(request: web.Request) -> web.Response:
    cache = ctx(request).ready_cache()
    return json_response({"topics": [t.to_dict() for _, t in sorted(cache.topics.items())]})


async def create_topic(request: web.Request) -> web.Response:
    c = ctx(request)
    c.ready_cache()  # a write is confirmed through the cache
    cfg = TopicConfig.from_dict(await read_json(request), strict=True)
    _refuse_internal(cfg.name)
    await visible(c.cache, await c.registry.put_topic(cfg, create_only=True))
    return json_response(cfg.to_dict(), status=201)


async def get_topic(request: web.Request) -> web.Response:
    name = validate_topic(request.match_info["topic"], allow_internal=True)
    cfg = ctx(request).ready_cache().topics.get(name)
    if cfg is None:
        raise TopicNotFoundError(f"topic {name!r} does not exist")
    return json_response(cfg.to_dict())


async def put_topic(request: web.Request) -> web.Response:
    c = ctx(request)
    c.ready_cache()  # a write is confirmed through the cache
    name = _refuse_internal(validate_topic(request.match_info["topic"], allow_internal=True))
    cfg = TopicConfig.from_dict(await read_json(request), strict=True, name=name)
    await visible(c.cache, await c.registry.put_topic(cfg))
    return json_response(cfg.to_dict())


async def delete_topic(request: web.Request) -> web.Response:
    c = ctx(request)
    c.ready_cache()  # a write is confirmed through the cache
    name = _refuse_internal(validate_topic(request.match_info["topic"], allow_internal=True))
    revision = await c.registry.delete_topic(name)
    if not revision:
        raise TopicNotFoundError(f"topic {name!r} does not exist")
    await visible(c.cache, revision)
    return json_response({"deleted": name})


def _refuse_internal(name: str) -> str:
    """`name`, unless it is an internal topic: those only their owning services write."""
    if is_internal(name):
        raise InvalidNameError(f"topic {name!r} is internal: only the broker and the services "
                               f"that own it create, change or delete it")
    return name
