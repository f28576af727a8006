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

from ferry.auth.acl import ADMIN, broker_resource, topic_resource
from ferry.auth.nonces import ReplayGuard
from ferry.auth.signing import (
    SignedParts,
    check_signature,
    check_wire,
    parse_wire_auth,
    string_to_sign_repl,
)
from ferry.errors import AccessDeniedError, AuthenticationError, BusyError
from ferry.routing import EtcdRegistry
from ferry.service.auth_registry import AuthRegistry
from ferry.wire import Frame

from ferry_broker.config import BrokerConfig
from ferry_broker.permissions import OPEN_CODES, check_permission
from ferry_broker.replication.protocol import Auth

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

    def identity(self, frame: Frame) -> str:
        """The access key of a request `check` passed (its signature is not checked again)."""
        return parse_wire_auth(frame.auth).access_key

    def may_publish(self, access_key: str, topic: str) -> bool:
        """Whether `access_key` holds `pub` on `topic` (the ACL caches the answer)."""
        return self.registry.acl.allows(access_key, "pub", topic_resource(topic))

    def require_topic_right(self, frame: Frame, topic: str, admin_area: str) -> None:
        """Refuse a request whose need the permission table cannot read from its fields.

        An END_TRANSACTION names a message id; its topic is the half's, read from
        the store: the identity needs `pub` on it, or admin `admin_area`.
        """
        access_key = self.identity(frame)
        if self.may_publish(access_key, topic) or \
                self.registry.acl.allows(access_key, admin_area, ADMIN):
            return
        self.refused_denied += 1
        raise AccessDeniedError(f"access denied: {access_key!r} may not 'pub' on "
                                f"{topic_resource(topic)!r} (the transaction's topic)")

    def authenticate_slave(self, auth: Auth, master: str) -> str:
        """The access key that signed a replication AUTH frame addressed to `master`
        (`cluster/name/id`); AuthenticationError (or BusyError) if none. Its nonce is
        remembered only by `authorize_slave`, once the identity's right is known."""
        if not self.loaded:
            raise BusyError("auth is on and identities are not loaded yet")
        parts = SignedParts(auth.access_key, auth.ts_ms, auth.nonce, auth.signature)
        try:
            check_signature(parts, lambda: string_to_sign_repl(
                auth.access_key, auth.ts_ms, auth.nonce, master, auth.hello_sha256),
                self.registry.signing_key, self.guard)
            return auth.access_key
        except AuthenticationError as exc:
            self.refused_unauthenticated += 1
            raise AuthenticationError(f"{exc}; an AUTH frame signs the master it is "
                                      f"for, and this is {master}") from None

    def authorize_slave(self, auth: Auth, name: str, broker_id: int) -> None:
        """AccessDeniedError unless the identity that signed `auth` may replicate as broker
        `name`/`broker_id`; then its nonce is remembered (a replayed AUTH is refused)."""
        access_key = auth.access_key
        resource = broker_resource(name, broker_id)
        if not self.registry.acl.allows(access_key, "replicate", resource):
            self.refused_denied += 1
            raise AccessDeniedError(f"access denied: {access_key!r} may not 'replicate' "
                                    f"on {resource!r} (replication link)")
        try:
            self.guard.remember(access_key, auth.ts_ms, auth.nonce)
        except AuthenticationError:
            self.refused_unauthenticated += 1
            raise

    def stats(self) -> dict[str, object]:
        """The `auth` part of /v1/stats."""
        return {"enabled": True, "loaded": self.loaded, "identities": len(self.registry.users),
                "refused_unauthenticated": self.refused_unauthenticated,
                "refused_denied": self.refused_denied, "replay_guard": self.guard.stats()}
