"""The name server's controller: wires registry, cache and HTTP API; starts and stops them.

The HTTP server comes up first so that /healthz answers at once; the cache
then loads from etcd (retrying while etcd is unreachable) and /readyz turns
200. SIGTERM or SIGINT stops it cleanly: stop accepting, finish the requests
in flight, stop watching, close the etcd connection. namesrv holds no state of
its own, so there is nothing to flush.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from importlib.metadata import PackageNotFoundError, version

from aiohttp import web
from ferry.auth.http import HttpAuth, registry_auth, server_ssl
from ferry.auth.registry import AuthRegistry
from ferry.http_limits import HttpGuard, HttpLimits
from ferry.routing import EtcdRegistry, EtcdUnavailable, RegistryCache

from ferry_namesrv.api import build_app
from ferry_namesrv.config import ENV_PREFIX, NamesrvConfig
from ferry_namesrv.context import NamesrvContext
from ferry_namesrv.permissions import ROUTES

log = logging.getLogger("ferry_namesrv")

_MAX_BACKOFF_S = 5.0
# Requests in flight get this long to finish on shutdown.
SHUTDOWN_GRACE_S = 5.0


def _version() -> str:
    try:
        return version("ferry-namesrv")
    except PackageNotFoundError:
        return "0.0.0"


class NamesrvApp:
    """One namesrv instance: `await start()`, then `await stop()` (or `run()` for both)."""

    def __init__(self, config: NamesrvConfig) -> None:
        self.config = config
        self.registry = EtcdRegistry(config.etcd, prefix=config.etcd_prefix)
        self.cache = RegistryCache(self.registry)
        self.context = NamesrvContext(config, self.registry, self.cache)
        # FERRY_AUTH=on: identities and rules from etcd, checked on every route (permissions.py).
        self.auth: AuthRegistry | None = AuthRegistry(self.registry) if config.auth else None
        self.http_auth: HttpAuth | None = (registry_auth(self.auth, ROUTES)
                                           if self.auth is not None else None)
        self._runner: web.AppRunner | None = None
        self._loader: asyncio.Task[None] | None = None
        self.port: int = config.port

    async def start(self) -> None:
        guard = HttpGuard(HttpLimits.from_env(ENV_PREFIX))
        app = build_app(self.context, _version(), self.http_auth, guard=guard)
        self._runner = guard.runner(app, access_log=None, shutdown_timeout=SHUTDOWN_GRACE_S)
        await self._runner.setup()
        # FERRY_TLS_CERT / FERRY_TLS_KEY (or FERRY_NAMESRV_TLS_*): HTTPS only.
        site = await guard.start_site(self._runner, self.config.host, self.config.port,
                                      ssl_context=server_ssl("namesrv"))
        self.port = site.port
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

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()  # stops accepting, lets in-flight requests finish
            self._runner = None
        if self._loader is not None:
            self._loader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loader
            self._loader = None
        await self.cache.stop()
        if self.auth is not None:
            await self.auth.stop()
        await self.registry.stop()
        log.info("stopped")

    async def run(self) -> None:
        """Start, wait for SIGTERM or SIGINT, stop."""
        stopping = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stopping.set)
        await self.start()
        try:
            await stopping.wait()
            log.info("stopping on signal")
        finally:
            await self.stop()
