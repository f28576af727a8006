"""ferry.idempotence: idempotent consumption inside the consumer's own process.

The strong check is `Ledger`: a 流水 ledger row inserted in the caller's own
database transaction, unique per (scene, business key), so a duplicate raises
`DuplicateMessage` and its transaction rolls back (docs/idempotence.md).
"""
from __future__ import annotations

from ferry.errors import DuplicateMessage
from ferry.idempotence.keys import biz_key_of
from ferry.idempotence.ledger import DEFAULT_TABLE, Ledger, LedgerEntry, MessageRef
from ferry.idempotence.ledger_conn import LedgerUsageError

__all__ = ["DEFAULT_TABLE", "DuplicateMessage", "Ledger", "LedgerEntry", "LedgerUsageError",
           "MessageRef", "biz_key_of"]
