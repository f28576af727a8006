"""GET /v1/routes/{topic}: where a topic lives; creates it on first use when allowed."""
from __future__ import annotations

import logging

from aiohttp import web
from ferry.errors import AlreadyExistsError, BusyError, TopicNotFoundError
from ferry.names import is_internal, validate_topic
from ferry.routing import TopicConfig
from ferry.service.auth import access_key_of
from ferry.service.errors import json_response

from ferry_namesrv.context import NamesrvContext, ctx
from ferry_namesrv.handlers.common import WRITE_VISIBLE_TIMEOUT_S, visible

log = logging.getLogger("ferry_namesrv.routes")

_TRUE = ("1", "true", "yes")


async def get_route(request: web.Request) -> web.Response:
    c = ctx(request)
    topic = validate_topic(request.match_info["topic"], allow_internal=True)
    create = request.query.get("create", "").lower() in _TRUE
    route = c.ready_cache().route(topic)
    if route is None and create:
        route = await _auto_create(c, topic, access_key_of(request))
    if route is None:
        raise TopicNotFoundError(f"topic {topic!r} does not exist"
                                 + ("" if create else " (ask with ?create=1 to create it)"))
    return json_response(route)


async def _auto_create(c: NamesrvContext, topic: str,
                       identity: str | None) -> dict[str, object] | None:
    """Create `topic` with the default queue count over every master, for `identity`.

    The put is create-only, so of several namesrv instances (or clients)
    creating at once exactly one writes and all answer with that config.
    Internal topics (`%RETRY%...`) are created by brokers, never here.
    The topic limits (topic_quota.py) are checked first.
    """
    if not c.config.auto_create_topics:
        raise TopicNotFoundError(f"topic {topic!r} does not exist and auto-create is off")
    if is_internal(topic):
        raise TopicNotFoundError(f"internal topic {topic!r} does not exist")
    cfg = TopicConfig(topic, queues=c.config.default_queues)
    c.quota.reserve(topic, identity, len(c.cache.topics))
    try:
        revision = await c.registry.put_topic(cfg, create_only=True)
    except AlreadyExistsError:
        c.quota.release(identity)
        # Someone else created it a moment ago; wait for our watch to bring it.
        await _catch_up(c, topic)
        return c.cache.route(topic)
    except BaseException:
        c.quota.release(identity)
        raise
    log.info("auto-created topic", extra={"topic": topic, "queues": cfg.queues,
                                          "identity": identity})
    await visible(c.cache, revision)
    return c.cache.route(topic)


async def _catch_up(c: NamesrvContext, topic: str) -> None:
    stored = await c.registry.client.get(c.registry.topic_key(topic))
    if stored is None:
        return  # created and deleted again in between: the route is None, a 404
    if not await c.cache.wait_revision(stored.mod_revision, WRITE_VISIBLE_TIMEOUT_S):
        raise BusyError(f"topic {topic!r} exists but this namesrv has not seen it yet")
