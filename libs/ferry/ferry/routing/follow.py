"""Following an etcd prefix: watch it, and when the watch breaks, reload it whole.

The route cache (`ferry.routing.cache`) and the identities (`ferry.service.auth_registry`)
both load a prefix, then watch it from the loaded revision. A watch that ends or
fails leaves the cache stale, so it is reloaded with back-off (0.2 s doubling to
5 s) until etcd answers, switching to another etcd endpoint when there is one;
then watching starts again.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from ferry.routing.registry import EtcdRegistry, EtcdUnavailable

log = logging.getLogger("ferry.routing.follow")

FIRST_BACKOFF_S = 0.2
MAX_BACKOFF_S = 5.0


async def follow_prefix(registry: EtcdRegistry, what: str,
                        watch: Callable[[], Awaitable[None]],
                        load: Callable[[], Awaitable[None]],
                        on_broken: Callable[[], None],
                        on_reloaded: Callable[[], None]) -> None:
    """Run `watch` forever; after it ends or fails, call `on_broken`, then `load` until it
    succeeds (then `on_reloaded`) and watch again. `what` names the cache in logs."""
    backoff_s = FIRST_BACKOFF_S
    while True:
        try:
            await watch()
            log.warning("%s: etcd watch ended; reloading", what)
        except EtcdUnavailable as exc:
            log.warning("%s: etcd watch failed (%s); reloading in %.1fs", what, exc, backoff_s)
        except Exception:
            log.exception("%s: etcd watch failed; reloading", what)
        on_broken()
        while True:
            await asyncio.sleep(backoff_s)
            backoff_s = min(backoff_s * 2, MAX_BACKOFF_S)
            try:
                client = registry.client
                await load()
                on_reloaded()
                backoff_s = FIRST_BACKOFF_S
                break
            except RuntimeError:
                continue  # the registry was stopped before its follower; stop() follows
            except EtcdUnavailable as exc:
                log.warning("%s: etcd reload failed (%s); retrying in %.1fs", what, exc,
                            backoff_s)
                if len(registry.endpoints) > 1:
                    await registry.failover(client)


class PrefixFollower:
    """A copy of one etcd prefix: loaded whole (`_load`), then followed by a watch from
    the loaded revision, each event handed to `_apply_event`; a broken watch is followed
    by a reload (`follow_prefix`). The route cache and the identity registry are two."""

    #: Names the copy in logs.
    what = "etcd prefix"

    def __init__(self, registry: EtcdRegistry) -> None:
        self._followed = registry
        #: Times the watch was lost and the copy reloaded.
        self.reloads = 0
        self._watching = False

    @property
    def watching(self) -> bool:
        """True while a watch is established (False while etcd is unreachable)."""
        return self._watching

    def _watch_from(self) -> tuple[bytes, int]:
        """(the prefix, the revision the copy reflects)."""
        raise NotImplementedError

    async def _load(self) -> None:
        raise NotImplementedError

    async def _apply_event(self, kind: str, key: bytes, value: bytes, revision: int) -> None:
        raise NotImplementedError

    async def _run(self) -> None:
        await follow_prefix(self._followed, self.what, self._watch, self._load,
                            self._watch_broken, self._reloaded)

    def _watch_broken(self) -> None:
        self._watching = False

    def _reloaded(self) -> None:
        self.reloads += 1

    async def _watch(self) -> None:
        prefix, revision = self._watch_from()
        watch = await self._followed.client.watch_prefix(prefix, start_revision=revision + 1)
        self._watching = True
        try:
            async for event in watch:
                await self._apply_event(event.kind, event.kv.key, event.kv.value,
                                        int(event.kv.mod_revision))
        finally:
            with contextlib.suppress(Exception):
                await watch.cancel()
