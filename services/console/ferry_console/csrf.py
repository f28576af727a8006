"""Cross-site request refusal for the console's POST forms (the DLQ resend).

The console has no login and its forms carry no token, so a page on another
site must not be able to make a visitor's browser POST to it (a hidden form
resending a whole DLQ). Browsers say where a request comes from: `Origin`
on every POST, and `Sec-Fetch-Site` on modern ones. A state-changing request
(any method but GET, HEAD, OPTIONS) is refused with a 403 page when

- its `Origin` is not this console's own (scheme://host[:port] whose
  host[:port] is the request's `Host`, default ports ignored), `null` included;
- it has no `Origin` and its `Sec-Fetch-Site` is `cross-site` or `same-site`
  (another origin; `same-origin` and `none`, a typed URL, pass).

A request with neither header (curl, scripts, tests) passes: only browsers
are tricked into cross-site requests, and browsers send one of them. Behind a
reverse proxy the proxy must pass the visitor's `Host` through.
"""
from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from urllib.parse import urlsplit

from aiohttp import web
from ferry.log_limit import LogLimiter

from ferry_console.pages.common import render

log = logging.getLogger("ferry_console")
_limited = LogLimiter(log)  # the lines a client causes (ferry.log_limit)

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
#: Sec-Fetch-Site values that show the request came from this console's own pages.
SAME_ORIGIN_FETCH = frozenset({"same-origin", "none"})
_DEFAULT_PORTS = {"http": "80", "https": "443"}
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _host_port(host: str, scheme: str) -> str:
    """`host[:port]` lower-cased, without the scheme's default port."""
    host = host.strip().lower()
    default = _DEFAULT_PORTS.get(scheme)
    if default and host.endswith(":" + default) and not host.endswith("]"):
        host = host[: -len(default) - 1]
    return host


def foreign_reason(request: web.Request) -> str | None:
    """Why `request` looks cross-site (a sentence for the error page), or None."""
    origin = request.headers.get("Origin")
    if origin is not None:
        parts = urlsplit(origin.strip())
        if origin.strip() == "null" or not parts.scheme or not parts.netloc:
            return f"the request's Origin ({origin!r}) is not this console"
        if _host_port(parts.netloc, parts.scheme) != _host_port(request.host, parts.scheme):
            return (f"the request came from another site ({origin}), not this console "
                    f"({request.host})")
        return None
    fetch_site = request.headers.get("Sec-Fetch-Site")
    if fetch_site is not None and fetch_site.strip().lower() not in SAME_ORIGIN_FETCH:
        return f"the request came from another site (Sec-Fetch-Site: {fetch_site})"
    return None


@web.middleware
async def same_origin_only(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Refuse a state-changing request another site's page made (403 HTML page)."""
    if request.method not in SAFE_METHODS:
        reason = foreign_reason(request)
        if reason is not None:
            _limited.info("cross-site", "cross-site request refused",
                          extra={"path": request.path, "reason": reason})
            return render(request, "error.html", status=403, title="Error 403",
                          status_code=403,
                          message=f"Refused: {reason}. The console's forms only work from its "
                                  "own pages; open the page in the console and submit it there.")
    return await handler(request)
