"""The spine every Ferry service's app shares: start, ready, a clean stop on SIGTERM or SIGINT.

A service's app subclasses `ServiceApp`: `start()` builds and starts its
parts, calls `serve_http` and sets `_ready`; `stop_steps()` lists its stop
steps (each through `stop_step`, so that a failing one is logged and the
later ones still run). `stop()` runs them once; `run()` serves until
signalled. `ready` is what /readyz answers.
"""
from __future__ import annotations

import logging
from typing import Any

from aiohttp import web

from ferry.service.http import HttpServer
from ferry.service.lifecycle import serve_until_signalled


class ServiceApp:
    """One service instance: `await start()`, then `await stop()` (or `run()` for both)."""

    #: How the service names itself in its log lines ("txn-checker stopping"; "": "stopping").
    name = "service"
    log = logging.getLogger(__name__)

    def __init__(self, http: HttpServer, port: int) -> None:
        self.http = http
        #: The HTTP port: the configured one, then the one listened on (0 asks for a free one).
        self.port = port
        self._ready = False
        self._stopping = False

    @property
    def ready(self) -> bool:
        return self._ready and not self._stopping

    async def start(self) -> None:
        raise NotImplementedError

    async def serve_http(self, app: web.Application, host: str, **runner_kwargs: Any) -> None:
        """Serve `app` on host and the configured port (the port listened on is `port`)."""
        self.port = await self.http.start(app, host, self.port, **runner_kwargs)

    async def stop_steps(self) -> None:
        """The service's stop steps, in order (each through `stop_step`)."""

    async def stop(self) -> None:
        """Stop every part once; a failing step is logged and the next ones still run."""
        if self._stopping:
            return
        self._stopping = True
        self.log.info(f"{self.name} stopping".lstrip())
        await self.stop_steps()
        self.log.info(f"{self.name} stopped".lstrip())

    async def run(self) -> None:
        """Start, serve until SIGTERM/SIGINT, stop."""
        await serve_until_signalled(self.start, self.stop)
