"""ferry.idempotence: run a consumer's handler once per business key (see docs/idempotence.md).

The weak check is `RedisClaim` (a claim per (scene, business key) in Redis);
the strong check is `Ledger` (a row in the caller's own database transaction).
"""
from __future__ import annotations

from ferry.idempotence.claim import RedisClaim
from ferry.idempotence.keys import biz_key_of, claim_key, validate_scene
from ferry.idempotence.states import (
    Claim,
    ClaimBusyError,
    ClaimState,
    ClaimStats,
    ClaimUnavailableError,
    RedisUnavailablePolicy,
)

__all__ = [
    # weak check (Redis)
    "Claim",
    "ClaimBusyError",
    "ClaimState",
    "ClaimStats",
    "ClaimUnavailableError",
    "RedisClaim",
    "RedisUnavailablePolicy",
    # shared
    "biz_key_of",
    "claim_key",
    "validate_scene",
]
