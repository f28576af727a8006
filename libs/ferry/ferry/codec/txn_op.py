"""A transaction's op record in `%OP%`: how it ended, in its properties.

The broker writes one per ended transaction (END_TRANSACTION, or the
txn-checker's check-back and discard); the txn-checker reads them to resolve
the halves it holds. One declaration of the properties, used by both.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ferry.codec.system_properties import (
    HALF_OFFSET,
    REAL_QUEUE_ID,
    REAL_TOPIC,
    TXN_ACTION,
    TXN_BY,
    TXN_GROUP,
    TXN_ID,
)

COMMIT, ROLLBACK = "commit", "rollback"
ACTIONS = (COMMIT, ROLLBACK)
#: Who ended it: its producer, the checker after a check-back, or the checker giving up.
BY_VALUES = ("producer", "check", "discarded")


@dataclass(frozen=True, slots=True)
class TxnOp:
    """How one transaction ended, as its op record says."""

    txn_id: str        # the half's msg id: 32 upper-case hex
    action: str        # COMMIT or ROLLBACK
    by: str            # one of BY_VALUES
    half_offset: int   # the half's queue offset in `%HALF%` (-1 unknown)
    group: str         # the producer group
    topic: str         # the real topic
    queue_id: str = ""  # the real queue (as the half's REAL_QUEUE_ID said)

    def to_properties(self) -> dict[str, str]:
        return {TXN_ID: self.txn_id, TXN_ACTION: self.action, TXN_BY: self.by,
                HALF_OFFSET: str(self.half_offset), TXN_GROUP: self.group,
                REAL_TOPIC: self.topic, REAL_QUEUE_ID: self.queue_id}

    @classmethod
    def from_properties(cls, props: Mapping[str, str]) -> TxnOp:
        """Lenient: an unknown action reads as a rollback (nothing is committed on a guess),
        a missing `by` as the producer, a bad half offset as -1."""
        action = props.get(TXN_ACTION, "")
        try:
            half_offset = int(props.get(HALF_OFFSET, "-1") or -1)
        except ValueError:
            half_offset = -1
        return cls(props.get(TXN_ID, "").upper(), action if action in ACTIONS else ROLLBACK,
                   props.get(TXN_BY, "producer"), half_offset, props.get(TXN_GROUP, ""),
                   props.get(REAL_TOPIC, ""), props.get(REAL_QUEUE_ID, ""))
