"""ConsoleApp: starts the console's clients, the rate sampler and the HTTP server; stops them.

Start: the Admin and namesrv clients and the HTTP session, then HTTP, then
the topic-rate sampler. Stop (SIGTERM or SIGINT): the sampler, HTTP, the
clients; each step runs even if an earlier one failed. The console holds no
state that needs saving.
"""
from __future__ import annotations

import asyncio
import logging

from aiohttp import web
from ferry.auth.http import server_ssl
from ferry.http_limits import HttpGuard, HttpLimits
from ferry.lifecycle import cancel_and_wait, package_version, serve_until_signalled, stop_step

from ferry_console.api import MAX_CONSOLE_HTTP_BODY_BYTES, build_app
from ferry_console.config import ENV_PREFIX, ConsoleConfig
from ferry_console.pages.common import Console, environment
from ferry_console.rates import RateSampler
from ferry_console.sessions import SessionStore
from ferry_console.sources import Sources

log = logging.getLogger("ferry_console")


class ConsoleApp:
    """One console: `await start()`, then `await stop()` (or `run()` for both)."""

    def __init__(self, config: ConsoleConfig) -> None:
        self.config = config
        self.sources = Sources(config)
        self.rates = RateSampler(self.sources, config.rate_interval_ms)
        # FERRY_AUTH=on: a login per user; pages act through that user's own clients.
        sessions = (SessionStore(lambda creds: Sources(config, creds), config.session_ttl_ms,
                                 config.max_sessions) if config.auth else None)
        self.console = Console(config, self.sources, self.rates, environment(), sessions)
        self._runner: web.AppRunner | None = None
        self._sampler: asyncio.Task[None] | None = None
        self._ready = False
        self._stopping = False
        self.port = config.http_port

    @property
    def ready(self) -> bool:
        return self._ready and not self._stopping

    async def start(self) -> None:
        cfg = self.config
        await self.sources.start()
        guard = HttpGuard(HttpLimits.from_env(ENV_PREFIX, MAX_CONSOLE_HTTP_BODY_BYTES))
        app = build_app(self.console, lambda: self.ready, package_version("ferry-console"),
                        guard=guard)
        self._runner = guard.runner(app, access_log=None)
        await self._runner.setup()
        # FERRY_TLS_CERT / FERRY_TLS_KEY (or FERRY_CONSOLE_TLS_*): HTTPS only.
        site = await guard.start_site(self._runner, cfg.host, cfg.http_port,
                                      ssl_context=server_ssl("console"))
        self.port = site.port
        self._sampler = asyncio.create_task(self.rates.run(), name="rates")
        self._ready = True
        log.info("console ready", extra={"http_port": self.port, "namesrv": cfg.namesrv,
                                         "auth": cfg.auth,
                                         "url": f"http://{cfg.host}:{self.port}/console"})

    async def stop(self) -> None:
        """Stop every part; a failing step is logged and the next ones still run."""
        if self._stopping:
            return
        self._stopping = True
        log.info("console stopping")
        await stop_step("stop the rate sampler", lambda: cancel_and_wait(self._sampler))
        if self._runner is not None:
            await stop_step("stop the HTTP server", self._runner.cleanup)
        if self.console.sessions is not None:
            await stop_step("end the sessions", self.console.sessions.close)
        await stop_step("close the clients", self.sources.stop)
        log.info("console stopped")

    async def run(self) -> None:
        """Start, serve until SIGTERM/SIGINT, stop."""
        await serve_until_signalled(self.start, self.stop)
