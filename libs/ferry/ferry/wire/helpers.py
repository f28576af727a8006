"""Building requests and responses, and turning an error response back into its exception."""
from __future__ import annotations

from typing import Any

from ferry.errors import FerryError, SystemError_, error_for_code
from ferry.wire.codes import Flag
from ferry.wire.frame import Frame


def request(
    code: int,
    request_id: int,
    fields: dict[str, Any] | None = None,
    body: bytes | memoryview = b"",
    oneway: bool = False,
) -> Frame:
    """A request frame; `oneway` asks the peer not to answer."""
    return Frame(
        int(code),
        request_id,
        int(Flag.ONEWAY) if oneway else 0,
        fields=fields if fields is not None else {},
        body=body,
    )


def response(
    req: Frame, fields: dict[str, Any] | None = None, body: bytes | memoryview = b""
) -> Frame:
    """The successful answer to `req`."""
    return Frame(
        req.code,
        req.request_id,
        int(Flag.RESPONSE),
        fields=fields if fields is not None else {},
        body=body,
    )


def error_response(req: Frame, exc: BaseException) -> Frame:
    """The error answer to `req`: `e` is the exception's wire code, `m` its text.

    An exception that is not a FerryError is an internal failure: it goes out
    as SystemError_ (code 1) with only its class name, so internals do not leak.
    """
    if isinstance(exc, FerryError):
        code, message = exc.code, str(exc) or type(exc).__name__
    else:
        code, message = SystemError_.code, f"internal error ({type(exc).__name__})"
    return Frame(req.code, req.request_id, int(Flag.RESPONSE), code, message)


def check_response(frame: Frame) -> Frame:
    """Return `frame` if it is a success; raise its FerryError subclass if it carries an error."""
    if frame.error:
        raise error_for_code(frame.error, frame.message)
    return frame
