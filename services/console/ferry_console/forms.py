"""Reading a posted form: a body aiohttp cannot parse is the client's error (400), not ours."""
from __future__ import annotations

from aiohttp import web
from ferry.errors import MalformedRequestError
from multidict import MultiDictProxy


async def read_form(request: web.Request) -> MultiDictProxy[str | bytes | bytearray | web.FileField]:
    """The request's form fields; MalformedRequestError when the body cannot be read as one
    (a multipart body without its boundary, found by tests/fuzz)."""
    try:
        return await request.post()
    except ValueError as exc:
        raise MalformedRequestError(f"the form cannot be read: {exc}") from None
