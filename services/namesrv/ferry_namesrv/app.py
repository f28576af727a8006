"""The name server's controller: wires registry, cache and HTTP API; starts and stops them.

The HTTP server comes up first so that /healthz answers at once; the cache
then loads from etcd (retrying while etcd is unreachable) and /readyz turns
200. SIGTERM or SIGINT stops it cleanly: stop accepting, finish the requests
in flight, stop watching, close the etcd connection. namesrv holds no state of
its own, so there is nothing to flush.
"""
from __future__ import annotations

import asyncio
import logging

from ferry.routing import EtcdRegistry, EtcdUnavailable, RegistryCache
from ferry.service.app import ServiceApp
from ferry.service.auth import HttpAuth, registry_auth
from ferry.service.auth_registry import AuthRegistry
from ferry.service.http import HttpServer
from ferry.service.lifecycle import cancel_and_wait, package_version, stop_step

from ferry_namesrv.api import build_app
from ferry_namesrv.config import ENV_PREFIX, NamesrvConfig
from ferry_namesrv.context import NamesrvContext
from ferry_namesrv.permissions import ROUTES

log = logging.getLogger("ferry_namesrv")

_MAX_BACKOFF_S = 5.0
# Requests in flight get this long to finish on shutdown.
SHUTDOWN_GRACE_S = 5.0


class NamesrvApp(ServiceApp):
    """One namesrv instance: `await start()`, then `await stop()` (or `run()` for both)."""

    name = ""  # its logger says which service: "stopping", "stopped"
    log = log

    def __init__(self, config: NamesrvConfig) -> None:
        super().__init__(HttpServer("namesrv", ENV_PREFIX), config.port)
        self.config = config
        self.registry = EtcdRegistry(config.etcd, prefix=config.etcd_prefix)
        self.cache = RegistryCache(self.registry)
        self.context = NamesrvContext(config, self.registry, self.cache)
        # FERRY_AUTH=on: identities and rules from etcd, checked on every route (permissions.py).
        self.auth: AuthRegistry | None = AuthRegistry(self.registry) if config.auth else None
        self.http_auth: HttpAuth | None = (registry_auth(self.auth, ROUTES, "namesrv")
                                           if self.auth is not None else None)
        self._loader: asyncio.Task[None] | None = None

    @property
    def ready(self) -> bool:
        return self.cache.loaded and not self._stopping

    async def start(self) -> None:
        app = build_app(self.context, package_version("ferry-namesrv"), self.http_auth,
                        guard=self.http.guard)
        await self.serve_http(app, self.config.host, shutdown_timeout=SHUTDOWN_GRACE_S)
        log.info("listening", extra={"host": self.config.host, "port": self.port,
                                     "etcd": self.config.etcd, "prefix": self.config.etcd_prefix,
                                     "auto_create_topics": self.config.auto_create_topics,
                                     "auth": self.config.auth})
        self._loader = asyncio.create_task(self._load(), name="namesrv-load")

    async def _load(self) -> None:
        """Connect and load the cache, retrying with back-off until etcd answers."""
        backoff_s = 0.2
        while True:
            try:
                await self.registry.start()
                if self.auth is not None:
                    # Before the cache: /readyz (the cache loaded) then means identities are too.
                    await self.auth.start()
                await self.cache.start()
                log.info("ready", extra={"revision": self.cache.revision,
                                         "brokers": len(self.cache.brokers),
                                         "topics": len(self.cache.topics)})
                return
            except (*EtcdUnavailable, ConnectionError) as exc:
                log.warning("etcd not reachable yet (%s); retrying in %.1fs", exc, backoff_s)
                await asyncio.sleep(backoff_s)
                backoff_s = min(backoff_s * 2, _MAX_BACKOFF_S)

    async def stop_steps(self) -> None:
        # Stops accepting, lets in-flight requests finish (SHUTDOWN_GRACE_S).
        await stop_step("stop the HTTP API", self.http.stop)
        await stop_step("stop loading", lambda: cancel_and_wait(self._loader))
        await stop_step("stop the route cache", self.cache.stop)
        if self.auth is not None:
            await stop_step("stop the auth registry", self.auth.stop)
        await stop_step("close the etcd client", self.registry.stop)
