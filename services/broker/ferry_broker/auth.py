"""The broker's side of authentication: who sent a request, and may they.

With auth on (FERRY_AUTH=on) every request's signature is verified
(ferry.auth.signing: known key, timestamp window, HMAC over this broker's
target `cluster/name/id`), then its permission (permissions.py), and only
then is its nonce remembered (not seen before, within the identity's quota),
all before the request becomes a task; a refusal is an error response and the
connection goes on serving. IDENTIFY (which tells a client the target) is the
one code answered unsigned. Identities
and rules come from etcd (ferry.service.auth_registry), loaded in the background:
until they are, requests are refused with BusyError (retriable), never let
through. With auth off none of this exists (the server checks one attribute).
"""
from __future__ import annotations

import asyncio
import contextlib
import logging

from ferry.auth.acl import ADMIN
from ferry.auth.nonces import ReplayGuard
from ferry.auth.signing import SignedParts, check_wire, string_to_sign_repl, verify_parts
from ferry.errors import AccessDeniedError, AuthenticationError, BusyError
from ferry.routing import EtcdRegistry
from ferry.service.auth_registry import AuthRegistry
from ferry.wire import Frame

from ferry_broker.config import BrokerConfig
from ferry_broker.permissions import OPEN_CODES, check_permission
from ferry_broker.replication.protocol import decode_auth

log = logging.getLogger(__name__)

_RETRY_FIRST_S = 0.2
_RETRY_MAX_S = 5.0


class BrokerAuth:
    """Verifies and authorizes wire requests (one per broker, shared by its ports)."""

    def __init__(self, config: BrokerConfig, registry: AuthRegistry | None = None) -> None:
        if registry is None:
            if not config.etcd:
                raise ValueError("FERRY_AUTH=on needs etcd (FERRY_BROKER_ETCD): identities "
                                 "and permissions live there")
            registry = AuthRegistry(EtcdRegistry(config.etcd, prefix=config.etcd_prefix))
        self.registry = registry
        self.guard = ReplayGuard(config.auth_window_ms, config.auth_max_nonces,
                                 future_ms=config.auth_future_ms,
                                 max_per_key=config.auth_max_nonces_per_key)
        #: What clients sign for (IDENTIFY tells them).
        self.target = config.auth_target
        self.loaded = False
        self.refused_unauthenticated = 0
        self.refused_denied = 0
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Load identities in the background, retrying until etcd answers."""
        self._task = asyncio.get_running_loop().create_task(self._load(), name="broker-auth")

    async def _load(self) -> None:
        backoff_s = _RETRY_FIRST_S
        while True:
            try:
                await self.registry.etcd.start()
                await self.registry.start()
                self.loaded = True
                log.info("auth on: %d identities loaded", len(self.registry.users))
                return
            except Exception as exc:  # aetcd and socket errors alike
                log.warning("auth: etcd not reachable yet (%s); retrying in %.1fs", exc, backoff_s)
                with contextlib.suppress(Exception):
                    await self.registry.etcd.stop()
                await asyncio.sleep(backoff_s)
                backoff_s = min(backoff_s * 2, _RETRY_MAX_S)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self.registry.stop()
        await self.registry.etcd.stop()

    def authenticate(self, frame: Frame) -> SignedParts:
        """The signature of `frame`, checked (its nonce not yet remembered); raises
        AuthenticationError (or BusyError) if there is none valid."""
        if not self.loaded:
            raise BusyError("auth is on and identities are not loaded yet; try again shortly")
        try:
            return check_wire(frame.auth, self.target, frame.code, frame.fields, frame.body,
                              self.registry.signing_key, self.guard)
        except AuthenticationError:
            self.refused_unauthenticated += 1
            raise

    def check(self, frame: Frame) -> str | None:
        """Authenticate and authorize `frame`, then remember its nonce; returns its access
        key (None for a code answered unsigned) or raises.

        The nonce comes last: a request refused for its permission holds no slot of
        the replay guard, so an identity with no rights cannot fill it.
        """
        if frame.code in OPEN_CODES:
            return None
        parts = self.authenticate(frame)
        try:
            check_permission(self.registry.acl, parts.access_key, frame)
        except AccessDeniedError:
            self.refused_denied += 1
            raise
        try:
            self.guard.remember(parts.access_key, parts.ts_ms, parts.nonce)
        except AuthenticationError:
            self.refused_unauthenticated += 1
            raise
        return parts.access_key

    def authenticate_slave(self, hello: bytes, auth: bytes) -> None:
        """Check a replication AUTH frame over its HELLO, then admin `replicate`."""
        if not self.loaded:
            raise BusyError("auth is on and identities are not loaded yet")
        access_key, ts_ms, nonce, signature = decode_auth(auth)
        parts = SignedParts(access_key, ts_ms, nonce, signature)
        try:
            verify_parts(parts, lambda: string_to_sign_repl(access_key, ts_ms, nonce, hello),
                         self.registry.signing_key, self.guard)
        except AuthenticationError:
            self.refused_unauthenticated += 1
            raise
        if not self.registry.acl.allows(access_key, "replicate", ADMIN):
            self.refused_denied += 1
            raise AccessDeniedError(f"access denied: {access_key!r} may not 'replicate' "
                                    "on 'admin' (replication link)")

    def stats(self) -> dict[str, object]:
        """The `auth` part of /v1/stats."""
        return {"enabled": True, "loaded": self.loaded, "identities": len(self.registry.users),
                "refused_unauthenticated": self.refused_unauthenticated,
                "refused_denied": self.refused_denied, "replay_guard": self.guard.stats()}
