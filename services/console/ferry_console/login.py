"""The console login: a page with access key and secret, a session cookie, and the guard.

With auth on (FERRY_AUTH=on) every page and action needs a session:

- `GET /console/login` shows the form; `POST /console/login` checks the
  access key and secret at namesrv (sessions.py) and sets the cookie, then
  redirects to the page the user first asked for (a path under /console only:
  never an open redirect);
- the cookie is HttpOnly (scripts cannot read it), SameSite=Strict (no other
  site's page makes the browser send it), Secure when the browser's request is
  HTTPS (directly or as a trusted proxy says; `cookie_secure`, proxies.py),
  limited to /console, and ends with the session (`session_ttl_ms`);
- failed logins are throttled per client address and per access key
  (throttle.py): past the budget a login is a 429 page, namesrv is not asked;
  a full console refuses a login with a 503 page (sessions.py);
- `POST /console/logout` ends the session and clears the cookie;
- without a valid session, a GET is redirected to the login page and any
  other request is refused with a 401 page; nothing is done.

With auth off there is no login: the pages use the console's shared sources.
/healthz, /readyz and /openapi.json stay open either way.
"""
from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import quote, urlsplit

from aiohttp import web
from ferry.auth.credentials import Credentials
from ferry.errors import AuthenticationError, BusyError, MalformedRequestError
from ferry.log_limit import LogLimiter

from ferry_console.forms import read_form
from ferry_console.pages.common import SESSION, Console, console, render

log = logging.getLogger("ferry_console")
_limited = LogLimiter(log)  # the lines a client causes (ferry.log_limit)

COOKIE_NAME = "ferry_console_session"
COOKIE_PATH = "/console"
LOGIN_PATH = "/console/login"
LOGOUT_PATH = "/console/logout"
#: Paths answered without a session.
OPEN_PATHS = frozenset({"/healthz", "/readyz", "/openapi.json", LOGIN_PATH})
#: The longest `next` path a login keeps (a bookmark, not a payload).
MAX_NEXT_CHARS = 512
#: Longer than any access key ([A-Za-z0-9_-]{3,64}): what a failed login keeps of one.
MAX_ACCESS_KEY_CHARS = 65
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def safe_next(raw: str | None) -> str:
    """Where to go after login: a path under /console of this console, else /console."""
    if not raw or len(raw) > MAX_NEXT_CHARS:
        return "/console"
    parts = urlsplit(raw)
    if parts.scheme or parts.netloc or not parts.path.startswith("/console") \
            or raw.startswith("//") or "\\" in raw:
        return "/console"
    return raw


@web.middleware
async def login_required(request: web.Request, handler: Handler) -> web.StreamResponse:
    """With auth on, let in only requests with a live session (and mark them with it)."""
    c = console(request)
    if c.sessions is None or request.path in OPEN_PATHS:
        return await handler(request)
    session = c.sessions.lookup(request.cookies.get(COOKIE_NAME))
    if session is None:
        if request.method in ("GET", "HEAD") and request.path.startswith("/console"):
            raise web.HTTPSeeOther(f"{LOGIN_PATH}?next={quote(request.path_qs, safe='')}")
        _limited.info("no-login", "request without a login refused",
                      extra={"path": request.path})
        return render(request, "error.html", status=401, title="Error 401", status_code=401,
                      message="Log in first: this action needs a login (the session may "
                              "have ended).")
    request[SESSION] = session
    return await session.serve(lambda: handler(request))


async def login_page(request: web.Request) -> web.Response:
    if console(request).sessions is None:
        raise web.HTTPSeeOther("/console")   # auth off: nothing to log in to
    return render(request, "login.html", title="Log in", error="",
                  next=safe_next(request.query.get("next")), access_key="")


def _login_refused(request: web.Request, status: int, message: str, target: str,
                   access_key: str) -> web.Response:
    """The login page again, with why the login failed."""
    return render(request, "login.html", status=status, title="Log in",
                  error=f"Login failed: {message}", next=target, access_key=access_key[:64])


async def login(request: web.Request) -> web.StreamResponse:
    c = console(request)
    sessions, throttle = c.sessions, c.throttle
    if sessions is None or throttle is None:
        raise web.HTTPSeeOther("/console")
    form = await read_form(request)
    access_key = str(form.get("access_key", "")).strip()[:MAX_ACCESS_KEY_CHARS]
    target = safe_next(str(form.get("next", "")))
    address = c.proxies.client_address(request)
    try:
        credentials: Credentials | None = Credentials(access_key, str(form.get("secret", "")))
    except MalformedRequestError as exc:
        credentials, malformed = None, str(exc)
    # counted as failed from here on (a malformed key names no identity: the address pays)
    refusal = throttle.attempt(address, access_key if credentials is not None else "")
    if refusal is not None:
        why, retry_after_s = refusal
        _limited.info("login-throttled", "login refused: throttled",
                      extra={"access_key": access_key, "address": address, "error": why})
        page = _login_refused(request, 429, why, target, access_key)
        page.headers["Retry-After"] = str(retry_after_s)
        return page
    try:
        if credentials is None:
            raise MalformedRequestError(malformed)
        session = await sessions.login(credentials)
    except (AuthenticationError, MalformedRequestError) as exc:
        _limited.info("login-refused", "login refused",
                      extra={"access_key": access_key, "address": address, "error": str(exc)})
        return _login_refused(request, 401, str(exc), target, access_key)
    except BaseException as exc:   # not a wrong secret: the attempt does not count
        throttle.forgive(address, access_key)
        if not isinstance(exc, BusyError):
            raise
        _limited.info("login-full", "login refused: sessions full", extra={"error": str(exc)})
        return _login_refused(request, 503, str(exc), target, access_key)
    throttle.forgive(address, access_key)
    response = web.HTTPSeeOther(target)
    response.set_cookie(COOKIE_NAME, sessions.cookie_value(session), path=COOKIE_PATH,
                        max_age=sessions.ttl_ms // 1000, httponly=True, samesite="Strict",
                        secure=c.proxies.secure_cookie(request))
    raise response


async def logout(request: web.Request) -> web.StreamResponse:
    sessions = console(request).sessions
    session = request.get(SESSION)
    if sessions is not None and session is not None:
        await sessions.logout(session.sid)
    response = web.HTTPSeeOther(LOGIN_PATH if sessions is not None else "/console")
    response.del_cookie(COOKIE_NAME, path=COOKIE_PATH)
    raise response


def login_stats(c: Console) -> dict[str, Any]:
    """The `login` part of the console's /v1/stats: sessions held and logins refused."""
    if c.sessions is None:
        return {"enabled": False}
    return {"enabled": True, "sessions": len(c.sessions), "logins": c.sessions.logins,
            "failed_logins": c.sessions.failed_logins,
            "refused_throttled": c.throttle.refused if c.throttle is not None else 0,
            "refused_full": c.sessions.refused_full}


def register(router: web.UrlDispatcher) -> None:
    router.add_get(LOGIN_PATH, login_page)
    router.add_post(LOGIN_PATH, login)
    router.add_post(LOGOUT_PATH, logout)
