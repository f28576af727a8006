"""What every page handler shares: the console context on the app, and rendering."""
from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import jinja2
from aiohttp import web

from ferry_console.config import ConsoleConfig
from ferry_console.prometheus import PrometheusCharts
from ferry_console.proxies import ProxyView
from ferry_console.rates import RateSampler
from ferry_console.sources import Sources

if TYPE_CHECKING:
    from ferry_console.sessions import Session, SessionStore
    from ferry_console.throttle import LoginThrottle


@dataclass
class Console:
    """The parts a page needs: config, the shared sources, rates, the template environment,
    the sessions and the login throttle (None with auth off: no login), what a trusted
    proxy says about a request, and the Prometheus the charts come from (None: own samples)."""

    config: ConsoleConfig
    sources: Sources
    rates: RateSampler
    templates: jinja2.Environment
    sessions: SessionStore | None = None
    throttle: LoginThrottle | None = None
    proxies: ProxyView = field(default_factory=ProxyView)
    prometheus: PrometheusCharts | None = None   # charts from Prometheus (when configured)


CONSOLE = web.AppKey("console", Console)
#: The logged-in user's session on a request (auth on; set by login.login_required).
SESSION: web.RequestKey[Session] = web.RequestKey("console_session")


def console(request: web.Request) -> Console:
    return request.app[CONSOLE]


def sources(request: web.Request) -> Sources:
    """The clients this request acts through: the logged-in user's (auth on), else the
    console's shared ones."""
    session = request.get(SESSION)
    return session.sources if session is not None else console(request).sources


def render(request: web.Request, template: str, status: int = 200,
           **values: Any) -> web.Response:
    """The page `template` rendered with `values` (autoescaped HTML)."""
    page = console(request).templates.get_template(template)
    session = request.get(SESSION)
    html = page.render(path=request.path, user=session.access_key if session else None,
                       **values)
    return web.Response(text=html, status=status, content_type="text/html", charset="utf-8")


def format_ms(ts_ms: int | float | None) -> str:
    """Epoch milliseconds as a UTC time with milliseconds ("" for none)."""
    if not ts_ms:
        return ""
    when = dt.datetime.fromtimestamp(ts_ms / 1000, tz=dt.UTC)
    return when.strftime("%Y-%m-%d %H:%M:%S.") + f"{int(ts_ms) % 1000:03d} UTC"


def environment() -> jinja2.Environment:
    """Templates from the package, autoescaped, with the console's filters."""
    env = jinja2.Environment(loader=jinja2.PackageLoader("ferry_console", "templates"),
                             autoescape=True, undefined=jinja2.StrictUndefined,
                             trim_blocks=True, lstrip_blocks=True)
    env.filters["ms"] = format_ms
    return env
