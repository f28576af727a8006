"""Claims over HTTP: `ferry.idempotence.RedisClaim` for consumers that are not Python.

A client claims (scene, biz_key) before its handler runs and gets a state:
`claimed` (with a token: run the handler, then confirm with the token, or
release it on failure), `done` (a duplicate: skip and acknowledge) or
`processing` (another holder has it: retry later, do not skip). Confirm and
release act only while the claim still holds that token. Redis unreachable
is a 503 (`ClaimsUnavailableError`): the client must retry, never skip.

The token is the claim's capability: many callers share this service, so it
is drawn at random per claim (128 bits), never a serial another caller could
count on from its own tokens. Who may claim in a scene at all is the ACL's
`claim` on `scene:<scene>` (permissions.py).
"""
from __future__ import annotations

import secrets
from collections import Counter
from typing import Any

import redis.asyncio as aioredis
from ferry.errors import FerryError, MalformedRequestError, StoreUnavailableError
from ferry.idempotence import (
    Claim,
    ClaimState,
    ClaimUnavailableError,
    RedisClaim,
    RedisUnavailablePolicy,
    claim_key,
)
from ferry.idempotence.claim import (
    MAX_LEASE_MS,
    MIN_LEASE_MS,
    REDIS_TIMEOUT_S,
    UNAVAILABLE,
    check_token,
)
from ferry.idempotence.keys import bounded_biz_key

TOKEN_MAX_CHARS = 64
TOKEN_BYTES = 16   # 32 hex characters, the shape `check_token` wants


class ServedClaim(RedisClaim):
    """A RedisClaim whose tokens are handed to callers over HTTP: random, not serial."""

    def new_token(self) -> str:
        return secrets.token_hex(TOKEN_BYTES)


class ClaimsUnavailableError(StoreUnavailableError):
    """Redis could not be reached for a claim step: HTTP 503, retry later."""


def _text(body: dict[str, Any], name: str, max_chars: int = 4096) -> str:
    value = body.get(name)
    if not isinstance(value, str) or not value or len(value) > max_chars:
        raise MalformedRequestError(f"{name} must be a non-empty string of at most "
                                    f"{max_chars} characters, got {value!r}")
    return value


class Claims:
    """The Redis claims of the service, with counters for /v1/stats."""

    def __init__(self, redis_url: str, *, lease_ms: int, done_ttl_ms: int) -> None:
        self.redis = aioredis.Redis.from_url(redis_url, socket_timeout=REDIS_TIMEOUT_S,
                                             socket_connect_timeout=REDIS_TIMEOUT_S)
        self.done_ttl_ms = done_ttl_ms
        self.default = self._claim(lease_ms)
        self._by_lease: dict[int, RedisClaim] = {lease_ms: self.default}
        self.outcomes: Counter[str] = Counter()   # claimed / done / processing / unavailable
        self.confirms: Counter[str] = Counter()   # ok / lost
        self.releases: Counter[str] = Counter()

    def _claim(self, lease_ms: int) -> RedisClaim:
        return ServedClaim(self.redis, lease_ms=lease_ms, done_ttl_ms=self.done_ttl_ms,
                          on_unavailable=RedisUnavailablePolicy.FAIL)

    def _for_lease(self, lease_ms: int | None) -> RedisClaim:
        if lease_ms is None:
            return self.default
        if type(lease_ms) is not int or not MIN_LEASE_MS <= lease_ms <= MAX_LEASE_MS:
            raise MalformedRequestError(f"lease_ms must be an integer {MIN_LEASE_MS}.."
                                        f"{MAX_LEASE_MS}, got {lease_ms!r}")
        claim = self._by_lease.get(lease_ms)
        if claim is None:
            if len(self._by_lease) > 64:   # few distinct leases are expected; bound them
                self._by_lease = {self.default.lease_ms: self.default}
            claim = self._by_lease[lease_ms] = self._claim(lease_ms)
        return claim

    @staticmethod
    def _keys(body: Any) -> tuple[str, str]:
        if not isinstance(body, dict):
            raise MalformedRequestError("the body must be a JSON object")
        scene, biz_key = _text(body, "scene", 64), _text(body, "biz_key")
        try:
            claim_key(scene, biz_key)   # validates the scene and the key
        except FerryError as exc:
            raise MalformedRequestError(str(exc)) from None
        return scene, biz_key

    async def acquire(self, body: Any) -> dict[str, Any]:
        scene, biz_key = self._keys(body)
        claim = self._for_lease(body.get("lease_ms"))
        try:
            got = await claim.acquire(scene, biz_key)
        except ClaimUnavailableError as exc:
            self.outcomes["unavailable"] += 1
            raise ClaimsUnavailableError(f"Redis unreachable: {exc}; retry the claim "
                                         "later (do not skip the message)") from exc
        self.outcomes[got.state.value] += 1
        out: dict[str, Any] = {"state": got.state.value, "scene": scene,
                               "biz_key": got.biz_key}
        if got.state is ClaimState.CLAIMED:
            out.update(token=got.token, lease_ms=claim.lease_ms)
        return out

    async def finish(self, body: Any, *, confirm: bool) -> dict[str, Any]:
        """Confirm (done, with the TTL) or release (deleted) a claim we hold by its token."""
        scene, biz_key = self._keys(body)
        token = _text(body, "token", TOKEN_MAX_CHARS)
        try:
            check_token(token)
        except ValueError as exc:   # e.g. "<token>,junk": never let it near a batch
            raise MalformedRequestError(f"token: {exc}") from exc
        claim = Claim(scene, bounded_biz_key(biz_key), claim_key(scene, biz_key), token,
                      ClaimState.CLAIMED)
        counter = self.confirms if confirm else self.releases
        try:
            ok = await (self.default.confirm(claim) if confirm
                        else self.default.release(claim))
        except UNAVAILABLE as exc:
            counter["unavailable"] += 1
            raise ClaimsUnavailableError(f"Redis unreachable: {exc}") from exc
        counter["ok" if ok else "lost"] += 1
        return {"ok": ok}

    async def state_of(self, scene: str, biz_key: str) -> str | None:
        try:
            return await self.default.state_of(scene, biz_key)
        except UNAVAILABLE as exc:
            raise ClaimsUnavailableError(f"Redis unreachable: {exc}") from exc

    async def ping(self) -> None:
        try:
            await self.redis.ping()
        except UNAVAILABLE as exc:
            raise ClaimsUnavailableError(f"Redis unreachable: {exc}") from exc

    def stats(self) -> dict[str, Any]:
        return {"outcomes": dict(self.outcomes), "confirms": dict(self.confirms),
                "releases": dict(self.releases)}

    async def close(self) -> None:
        await self.redis.aclose()
