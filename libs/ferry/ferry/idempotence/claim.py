"""The weak idempotence check: a claim per (scene, business key) in Redis.

A claim is one Redis key, `ferry:idem:{scene}:{biz_key}`. Taking it is a
`SET key processing:<token> NX PX lease_ms`: only one consumer gets it, and a
consumer that dies holding it loses it when the lease runs out. After the
handler succeeded the holder turns it into `done:<token>` for `done_ttl_ms`
(a later duplicate finds it and is skipped); after a failure the holder
deletes it (the retry may take it again). Confirm and release act only if the
key still holds *our* token, compared and changed in one Lua script: a holder
whose lease ran out and was taken over cannot confirm or delete the new
holder's claim. The claims (and the confirms) asked for in one turn of the
event loop go to Redis as one script call (`batching.Coalescer`): one round
trip for all the handlers `consumer.run` started together.

Weak, because Redis and the business change are not one transaction: a
crash between the business write and the confirm lets a duplicate run again
once the lease expires, and a Redis that loses writes (no persistence, a
failover) forgets "done" keys. The ledger (strong check) has neither gap.
"""
from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import re
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ferry.client.core.message import ConsumerRecord
from ferry.errors import FerryError
from ferry.idempotence.batching import MAX_BATCH, Coalescer
from ferry.idempotence.claim_scripts import ACQUIRE, CLAIM_OPS, CONFIRM, EXTEND, RELEASE
from ferry.idempotence.keys import (
    DEFAULT_KEY_PREFIX,
    biz_key_of,
    bounded_biz_key,
    claim_key,
    validate_scene,
)
from ferry.idempotence.states import (
    Claim,
    ClaimBusyError,
    ClaimState,
    ClaimStats,
    ClaimUnavailableError,
    RedisUnavailablePolicy,
)

log = logging.getLogger("ferry.idempotence")

DEFAULT_LEASE_MS = 30_000                       # a handler taking longer should extend()
DEFAULT_DONE_TTL_MS = 7 * 24 * 3_600_000        # duplicates come within days, not months
MIN_LEASE_MS, MAX_LEASE_MS = 100, 3_600_000
MIN_DONE_TTL_MS, MAX_DONE_TTL_MS = 1_000, 365 * 24 * 3_600_000
# Used only for a client made from a URL: a dead Redis must fail a claim quickly,
# not hold a consumer's handler for the OS connect timeout.
REDIS_TIMEOUT_S = 2.0
TOKEN_SERIAL_MASK = (1 << 64) - 1
_TOKEN = re.compile(r"[0-9a-f]{32}")
MAX_CACHED_SCENES = 1024   # validated scene names remembered per RedisClaim
MAX_PREFETCHED = 65_536    # prefetched claims kept waiting for their handlers at most
PROCESSING = "processing:"   # stored: "processing:<token>" or "done:<token>" (see the scripts)
# Errors that mean "Redis is unreachable"; a script or data error is a bug and propagates.
UNAVAILABLE = (RedisConnectionError, RedisTimeoutError, OSError)

Handler = Callable[[ConsumerRecord], Awaitable[Any]]

def _check_range(name: str, value: int, low: int, high: int) -> int:
    if not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"{name} must be an int in {low}..{high}, got {value!r}")
    return value


def check_token(token: str) -> str:
    """`token` if it has the shape of a claim token (32 lowercase hex), else ValueError.

    A token travels NUL-joined with others in one script call: one that could
    hold a separator (or anything but a token) must never get there.
    """
    if not isinstance(token, str) or _TOKEN.fullmatch(token) is None:
        raise ValueError(f"bad claim token {token!r}: 32 lowercase hex characters")
    return token


def _text(value: bytes | str | None) -> str:
    if value is None:
        return ""
    return value.decode() if isinstance(value, bytes) else value


class RedisClaim:
    """Claims on Redis around a message handler: `await claim.run(record, handler, scene=...)`.

    `redis` is a `redis.asyncio.Redis` (kept open on close) or a URL such as
    `redis://127.0.0.1:6379/0` (a client is made with short timeouts and
    closed by `aclose()` / `async with`). `on_unavailable` says what happens
    when Redis cannot be reached (RedisUnavailablePolicy; FAIL by default).
    `scene` is the default scene of `wrap()` and of `consumer.run(...,
    idempotence=claim)` (which otherwise uses the consumer group's name).
    """

    def __init__(self, redis: aioredis.Redis | str, *, lease_ms: int = DEFAULT_LEASE_MS,
                 done_ttl_ms: int = DEFAULT_DONE_TTL_MS,
                 on_unavailable: RedisUnavailablePolicy = RedisUnavailablePolicy.FAIL,
                 key_prefix: str = DEFAULT_KEY_PREFIX, scene: str | None = None) -> None:
        self.lease_ms = _check_range("lease_ms", lease_ms, MIN_LEASE_MS, MAX_LEASE_MS)
        self.done_ttl_ms = _check_range("done_ttl_ms", done_ttl_ms,
                                        MIN_DONE_TTL_MS, MAX_DONE_TTL_MS)
        self.on_unavailable = RedisUnavailablePolicy(on_unavailable)
        if not key_prefix or " " in key_prefix or "\0" in key_prefix:
            raise ValueError(f"bad key_prefix {key_prefix!r}")
        self.key_prefix = key_prefix
        self.scene = None if scene is None else validate_scene(scene)
        self._owned = isinstance(redis, str)
        self._redis: aioredis.Redis = (
            aioredis.Redis.from_url(redis, socket_timeout=REDIS_TIMEOUT_S,
                                    socket_connect_timeout=REDIS_TIMEOUT_S)
            if isinstance(redis, str) else redis)
        self._claim_ops = self._redis.register_script(CLAIM_OPS)
        # The claims and confirms of one event-loop turn share one script call.
        self._ops: Coalescer[tuple[str, str, str], str] = Coalescer(self._run_ops)
        self._extend = self._redis.register_script(EXTEND)
        self._release = self._redis.register_script(RELEASE)
        self.stats = ClaimStats()
        self._scenes: set[str] = set()   # scenes already validated
        # Claims taken by prefetch() for records whose handlers have not run yet,
        # by id(record) (the record is kept with it: an id is only unique while alive).
        self._prefetched: dict[int, tuple[ConsumerRecord, Claim]] = {}
        self._releasing: set[asyncio.Task[None]] = set()   # forget()'s releases, until done
        # A token names one claim attempt: random per RedisClaim, then a serial
        # (unique without a random draw per message).
        self._token_prefix = secrets.token_hex(8)
        self._token_serial = itertools.count()

    async def aclose(self) -> None:
        """Close the Redis client if this claim made it (from a URL)."""
        if self._owned:
            await self._redis.aclose()

    async def __aenter__(self) -> RedisClaim:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- the claim's steps --------------------------------------------------------------------
    async def acquire(self, scene: str, biz_key: str) -> Claim:
        """Try to take the claim of (scene, biz_key); the returned Claim says what was found.

        Redis unreachable: ClaimUnavailableError (policy FAIL) or an UNCHECKED
        claim (policy PROCESS).
        """
        attempt = self._attempt(scene, biz_key)
        try:
            found = await self._ops.submit((ACQUIRE, attempt[2], attempt[3]))
        except UNAVAILABLE as exc:
            return self._unavailable(*attempt, exc)
        return self._found(attempt, found)

    def _attempt(self, scene: str, biz_key: str) -> tuple[str, str, str, str]:
        """(scene, bounded biz_key, Redis key, a fresh token) of one claim attempt."""
        biz_key = bounded_biz_key(biz_key)
        if scene not in self._scenes:   # validated once per scene, not per message
            validate_scene(scene)
            if len(self._scenes) < MAX_CACHED_SCENES:
                self._scenes.add(scene)
        key = f"{self.key_prefix}:{scene}:{biz_key}"   # as keys.claim_key builds it
        return scene, biz_key, key, self.new_token()

    def new_token(self) -> str:
        """A fresh claim token (32 lowercase hex). Unique, not secret: the holder is this
        process. A claim served to others (the dedup service) draws unguessable ones."""
        return f"{self._token_prefix}{next(self._token_serial) & TOKEN_SERIAL_MASK:016x}"

    def _found(self, attempt: tuple[str, str, str, str], found: str) -> Claim:
        if found == "C":
            self.stats.claimed += 1
            return Claim(*attempt, ClaimState.CLAIMED)
        if found == "D":
            self.stats.skipped_done += 1
            return Claim(*attempt, ClaimState.DONE)
        self.stats.busy += 1
        return Claim(*attempt, ClaimState.PROCESSING)

    async def prefetch(self, records: Sequence[ConsumerRecord], *, scene: str) -> None:
        """Take the claims of `records` (a batch `consumer.run` just took) before their handlers start.

        One script call per MAX_BATCH records; each handler then finds its claim
        decided (`run` looks it up) instead of waiting for Redis on its own: one
        suspension less per message. Any failure just leaves the rest of the
        batch without a prefetched claim: those handlers acquire as usual and
        meet the unavailability policy there.
        """
        if len(self._prefetched) > MAX_PREFETCHED:   # handlers that never ran (a stop)
            self._prefetched.clear()
        try:
            attempts = [self._attempt(scene, biz_key_of(record)) for record in records]
            for start in range(0, len(attempts), MAX_BATCH):
                chunk = attempts[start:start + MAX_BATCH]
                found = await self._run_ops([(ACQUIRE, a[2], a[3]) for a in chunk])
                for record, attempt, one in zip(records[start:start + MAX_BATCH], chunk, found,
                                                strict=True):
                    self._prefetched[id(record)] = (record, self._found(attempt, one))
        except Exception as exc:   # Redis away, a bad key: the handlers acquire themselves
            log.debug("idempotence: prefetch of %d claims failed: %r", len(records), exc)

    def _unavailable(self, scene: str, biz_key: str, key: str, token: str,
                     exc: Exception) -> Claim:
        if self.on_unavailable is RedisUnavailablePolicy.PROCESS:
            self.stats.unavailable_unchecked += 1
            log.warning("idempotence: Redis unreachable (%s); policy PROCESS runs %s:%s "
                        "WITHOUT the duplicate check", exc, scene, biz_key)
            return Claim(scene, biz_key, key, token, ClaimState.UNCHECKED)
        self.stats.unavailable_failed += 1
        log.warning("idempotence: Redis unreachable (%s); %s:%s fails for a retry",
                    exc, scene, biz_key)
        raise ClaimUnavailableError(
            f"Redis unreachable for the claim of scene={scene}, biz_key={biz_key}: {exc}") from exc

    def forget(self, records: Sequence[ConsumerRecord]) -> None:
        """Drop the prefetched claims of `records` whose handlers will not run, releasing
        the ones taken (in the background), so a redelivery can take them at once
        rather than find them busy until the lease runs out."""
        for record in records:
            entry = self._prefetched.pop(id(record), None)
            if entry is not None and entry[0] is record \
                    and entry[1].state is ClaimState.CLAIMED:
                task = asyncio.get_running_loop().create_task(self._release_quietly(entry[1]))
                self._releasing.add(task)
                task.add_done_callback(self._releasing.discard)

    async def confirm(self, claim: Claim) -> bool:
        """Turn our processing claim into done (TTL done_ttl_ms); False if it is not ours now."""
        if claim.state is not ClaimState.CLAIMED:
            return False
        check_token(claim.token)
        done = await self._ops.submit((CONFIRM, claim.key, claim.token)) == "1"
        return self._owned_outcome(claim, done, "confirm")

    async def _run_ops(self, batch: list[tuple[str, str, str]]) -> str:
        """One character per item of `batch` (see claim_scripts.CLAIM_OPS): C / D / P or 1 / 0."""
        found = _text(await self._claim_ops(args=[
            self.lease_ms, self.done_ttl_ms, "".join([op for op, _, _ in batch]),
            "\0".join([key for _, key, _ in batch]), "\0".join([t for _, _, t in batch])]))
        if len(found) != len(batch):
            raise RuntimeError(f"claim script answered {len(found)} of {len(batch)} items")
        return found

    async def extend(self, claim: Claim, lease_ms: int | None = None) -> bool:
        """Renew our processing lease for a long handler; False if the claim is not ours now."""
        if claim.state is not ClaimState.CLAIMED:
            return False
        lease_ms = _check_range("lease_ms", lease_ms or self.lease_ms, MIN_LEASE_MS, MAX_LEASE_MS)
        ok = await self._extend(keys=[claim.key], args=[PROCESSING + claim.token, lease_ms])
        return self._owned_outcome(claim, bool(ok), "extend")

    async def release(self, claim: Claim) -> bool:
        """Delete our processing claim so a retry can take it; False if it is not ours now."""
        if claim.state is not ClaimState.CLAIMED:
            return False
        gone = await self._release(keys=[claim.key], args=[PROCESSING + claim.token])
        return self._owned_outcome(claim, bool(gone), "release")

    def _owned_outcome(self, claim: Claim, ok: bool, step: str) -> bool:
        if ok:
            if step == "confirm":
                self.stats.confirmed += 1
            elif step == "release":
                self.stats.released += 1
        else:
            self.stats.lost += 1
            log.warning("idempotence: %s of %s:%s found the claim no longer ours (the lease "
                        "of %d ms ran out)", step, claim.scene, claim.biz_key, self.lease_ms)
        return ok

    async def state_of(self, scene: str, biz_key: str) -> str | None:
        """What Redis holds for (scene, biz_key): "processing", "done" or None (for tools, tests)."""
        value = _text(await self._redis.get(claim_key(scene, biz_key, self.key_prefix)))
        return value.split(":", 1)[0] if value else None

    # -- around a handler ---------------------------------------------------------------------
    async def run(self, record: ConsumerRecord, handler: Handler, *, scene: str,
                  biz_key: str | None = None) -> ClaimState:
        """Run `handler(record)` at most once per (scene, business key) while claims hold.

        Returns CLAIMED (it ran and was confirmed), DONE (a duplicate: skipped,
        acknowledge it) or UNCHECKED (Redis away, policy PROCESS: it ran
        unchecked). Raises ClaimBusyError when another holder is processing it
        and ClaimUnavailableError when Redis is away under policy FAIL: both
        retriable, so `Consumer.run` nacks the message for a later retry. A
        handler's exception releases the claim and propagates.
        """
        # `guard` without the context manager's generator: this is the per-message path
        # of consumer.run, where that overhead showed in bench idempotence.
        entry = self._prefetched.pop(id(record), None) if self._prefetched else None
        if entry is not None and entry[0] is record and biz_key is None \
                and entry[1].scene == scene:
            claim = entry[1]
            if claim.state is ClaimState.PROCESSING:
                raise ClaimBusyError(f"being processed elsewhere: scene={scene}, "
                                     f"biz_key={claim.biz_key}; retry later")
        else:
            claim = await self._enter(record, scene, biz_key)
        if claim.state is not ClaimState.CLAIMED:
            if claim.should_run:   # UNCHECKED
                await handler(record)
            return claim.state
        try:
            await handler(record)
        except BaseException:
            await self._release_quietly(claim)
            raise
        await self._confirm_quietly(claim)
        return claim.state

    def wrap(self, handler: Handler, *, scene: str | None = None) -> Handler:
        """`handler` behind the claim, for `consumer.run(claim.wrap(handle, scene="pay"))`.

        `scene` defaults to the claim's own (`RedisClaim(scene=...)`); one of them is needed.
        The wrapped handler returns the ClaimState (DONE: a duplicate was skipped).
        """
        chosen = scene or self.scene
        if chosen is None:
            raise FerryError("RedisClaim.wrap needs a scene: wrap(handler, scene=...) or "
                             "RedisClaim(..., scene=...)")
        validate_scene(chosen)

        async def claimed(record: ConsumerRecord) -> ClaimState:
            return await self.run(record, handler, scene=chosen)
        return claimed

    @contextlib.asynccontextmanager
    async def guard(self, record: ConsumerRecord, *, scene: str,
                    biz_key: str | None = None) -> AsyncIterator[Claim]:
        """The claim around a block: `async with claim.guard(rec, scene="pay") as c:`.

        The block runs the handler only `if c.should_run` (a DONE claim is a
        duplicate: skip it). Leaving the block normally confirms our claim; an
        exception (or cancellation) releases it and propagates. Entering raises
        ClaimBusyError / ClaimUnavailableError as `run` does.
        """
        claim = await self._enter(record, scene, biz_key)
        if claim.state is not ClaimState.CLAIMED:
            yield claim
            return
        try:
            yield claim
        except BaseException:
            await self._release_quietly(claim)
            raise
        await self._confirm_quietly(claim)

    async def _enter(self, record: ConsumerRecord, scene: str, biz_key: str | None) -> Claim:
        """Acquire for `record`; ClaimBusyError when another holder is processing it."""
        claim = await self.acquire(scene, biz_key or biz_key_of(record))
        if claim.state is ClaimState.PROCESSING:
            raise ClaimBusyError(f"being processed elsewhere: scene={scene}, "
                                 f"biz_key={claim.biz_key}; retry later")
        return claim

    async def _release_quietly(self, claim: Claim) -> None:
        # The handler's error is what the caller must see; a claim we cannot
        # delete still frees itself when its lease runs out.
        try:
            await self.release(claim)
        except UNAVAILABLE as exc:
            log.warning("idempotence: release of %s:%s failed (%s); it frees itself in %d ms",
                        claim.scene, claim.biz_key, exc, self.lease_ms)

    async def _confirm_quietly(self, claim: Claim) -> None:
        # The handler's work is done: failing the message now would run it again
        # for sure, so a lost confirm is logged and counted, not raised (a
        # duplicate can run once the lease expires: the weak check's gap).
        try:
            await self.confirm(claim)
        except UNAVAILABLE as exc:
            self.stats.confirm_failed += 1
            log.warning("idempotence: confirm of %s:%s failed (%s); a duplicate may run after "
                        "the lease of %d ms", claim.scene, claim.biz_key, exc, self.lease_ms)
