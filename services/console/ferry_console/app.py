"""ConsoleApp: starts the console's clients, the rate and chart sampler and HTTP; stops them.

Start: the Admin and namesrv clients and the HTTP session, then HTTP, then
the topic-rate sampler. Stop (SIGTERM or SIGINT): the sampler, HTTP, the
clients; each step runs even if an earlier one failed. The console holds no
state that needs saving.
"""
from __future__ import annotations

import asyncio
import logging

from ferry.service.app import ServiceApp
from ferry.service.http import HttpServer
from ferry.service.lifecycle import cancel_and_wait, package_version, stop_step

from ferry_console.api import MAX_CONSOLE_HTTP_BODY_BYTES, build_app
from ferry_console.config import ENV_PREFIX, ConsoleConfig
from ferry_console.pages.common import Console, environment
from ferry_console.prometheus import PrometheusCharts
from ferry_console.proxies import ProxyView, parse_networks
from ferry_console.rates import RateSampler
from ferry_console.sessions import SessionStore
from ferry_console.sources import Sources
from ferry_console.throttle import LoginThrottle

log = logging.getLogger("ferry_console")


class ConsoleApp(ServiceApp):
    """One console: `await start()`, then `await stop()` (or `run()` for both)."""

    name = "console"
    log = log

    def __init__(self, config: ConsoleConfig) -> None:
        super().__init__(HttpServer("console", ENV_PREFIX, MAX_CONSOLE_HTTP_BODY_BYTES), config.http_port)
        self.config = config
        self.sources = Sources(config)
        self.rates = RateSampler(self.sources, config.rate_interval_ms, config.chart_points,
                                 config.chart_series)
        # FERRY_AUTH=on: a login per user; pages act through that user's own clients.
        sessions = (SessionStore(lambda creds: Sources(config, creds), config.session_ttl_ms,
                                 config.max_sessions, config.max_sessions_per_identity)
                    if config.auth else None)
        throttle = (LoginThrottle(config.login_failures_per_address,
                                  config.login_failures_per_identity, config.login_window_ms)
                    if config.auth else None)
        proxies = ProxyView(parse_networks(config.trusted_proxies), config.cookie_secure)
        prometheus = (PrometheusCharts(config.prometheus_url, config.request_timeout_ms,
                                       config.rate_interval_ms, config.chart_points)
                      if config.prometheus_url else None)
        self.console = Console(config, self.sources, self.rates, environment(), sessions,
                               throttle, proxies, prometheus)
        self._sampler: asyncio.Task[None] | None = None

    async def start(self) -> None:
        cfg = self.config
        await self.sources.start()
        app = build_app(self.console, lambda: self.ready, package_version("ferry-console"),
                        guard=self.http.guard)
        await self.serve_http(app, cfg.host)
        self._sampler = asyncio.create_task(self.rates.run(), name="rates")
        self._ready = True
        log.info("console ready", extra={"http_port": self.port, "namesrv": cfg.namesrv,
                                         "auth": cfg.auth,
                                         "url": f"http://{cfg.host}:{self.port}/console"})

    async def stop_steps(self) -> None:
        await stop_step("stop the rate sampler", lambda: cancel_and_wait(self._sampler))
        await stop_step("stop the HTTP server", self.http.stop)
        if self.console.sessions is not None:
            await stop_step("end the sessions", self.console.sessions.close)
        await stop_step("close the clients", self.sources.stop)
