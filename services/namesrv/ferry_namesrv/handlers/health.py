"""/healthz (the process answers) and /readyz (the cache is loaded from etcd)."""
from __future__ import annotations

from aiohttp import web
from ferry.errors import BusyError

from ferry_namesrv.context import ctx
from ferry_namesrv.handlers.common import json_response


async def healthz(request: web.Request) -> web.Response:
    return json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    """200 once the cache has loaded; it then keeps answering from the last state even
    while etcd is briefly unreachable (`watching` false), as a name server should."""
    cache = ctx(request).cache
    if not cache.loaded:
        raise BusyError("routes not loaded from etcd yet")
    return json_response({"status": "ready", "watching": cache.watching,
                          "revision": cache.revision, "brokers": len(cache.brokers),
                          "topics": len(cache.topics), "groups": len(cache.groups)})
