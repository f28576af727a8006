"""GET /v1/brokers: every live broker, as registered under its lease."""
from __future__ import annotations

from aiohttp import web
from ferry.service.errors import json_response

from ferry_namesrv.context import ctx


async def list_brokers(request: web.Request) -> web.Response:
    cache = ctx(request).ready_cache()
    brokers = [b.to_dict() for _, b in sorted(cache.brokers.items())]
    return json_response({"brokers": brokers, "revision": cache.revision})
