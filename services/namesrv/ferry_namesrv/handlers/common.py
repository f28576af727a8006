"""Helpers shared by the handlers: JSON bodies in and out, waiting for our own writes."""
from __future__ import annotations

import json
from typing import Any

from aiohttp import web
from ferry.errors import BusyError, MalformedRequestError
from ferry.routing import RegistryCache

# How long a write waits for this instance's cache to see it (read-your-writes).
WRITE_VISIBLE_TIMEOUT_S = 5.0


async def read_json(request: web.Request) -> Any:
    """The request body as JSON; MalformedRequestError if it is not valid UTF-8 JSON."""
    raw = await request.read()
    if not raw:
        raise MalformedRequestError("the request needs a JSON body")
    try:
        return json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise MalformedRequestError(f"the body is not valid JSON: {exc}") from None
    except RecursionError:
        raise MalformedRequestError("the body nests too deeply") from None


async def visible(cache: RegistryCache, revision: int) -> None:
    """Wait until our cache has applied `revision`, so the next read on this instance sees it."""
    if revision and not await cache.wait_revision(revision, WRITE_VISIBLE_TIMEOUT_S):
        raise BusyError("the write is stored in etcd but this namesrv has not seen it yet")
