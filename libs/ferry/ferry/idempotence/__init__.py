"""ferry.idempotence: run a consumer's handler once per business key (see docs/idempotence.md).

The weak check is `RedisClaim` (a claim per (scene, business key) in Redis);
the strong check is `Ledger` (a 流水 ledger row inserted in the caller's own
database transaction, unique per (scene, business key), so a duplicate raises
`DuplicateMessage` and its transaction rolls back). `consumer.run(handler,
idempotence=...)` wires either around a handler (see `wiring`).
"""
from __future__ import annotations

from ferry.errors import DuplicateMessage
from ferry.idempotence.claim import RedisClaim
from ferry.idempotence.keys import biz_key_of, claim_key, validate_scene
from ferry.idempotence.ledger import DEFAULT_TABLE, Ledger, LedgerEntry, MessageRef
from ferry.idempotence.ledger_conn import LedgerUsageError
from ferry.idempotence.states import (
    Claim,
    ClaimBusyError,
    ClaimState,
    ClaimStats,
    ClaimUnavailableError,
    Outcome,
    RedisUnavailablePolicy,
)
from ferry.idempotence.transactional import TransactionalLedger
from ferry.idempotence.wiring import IdempotenceCheck, IdempotenceStats

__all__ = [
    # weak check (Redis)
    "Claim",
    "ClaimBusyError",
    "ClaimState",
    "ClaimStats",
    "ClaimUnavailableError",
    "RedisClaim",
    "RedisUnavailablePolicy",
    # strong check (ledger)
    "DEFAULT_TABLE",
    "DuplicateMessage",
    "Ledger",
    "LedgerEntry",
    "LedgerUsageError",
    "MessageRef",
    "TransactionalLedger",
    # consumer.run(handler, idempotence=...)
    "IdempotenceCheck",
    "IdempotenceStats",
    "Outcome",
    # shared
    "biz_key_of",
    "claim_key",
    "validate_scene",
]
