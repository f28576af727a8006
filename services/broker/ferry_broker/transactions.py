"""Transactions on this broker: how half and op records are found, and what they count.

A transaction's id is its half message's id (32 hex). Nothing per transaction
is kept in memory: the store's key index is the map. The txn hook stores a
half in `%HALF%` with the extra key `TXN:<id>` after the user's keys, and
END_TRANSACTION stores the op record in `%OP%` under the same key, so "the
half of id X" and "the op of id X" are two `query_by_key` calls that work the
same after a restart (the index is on disk and rebuilt by recovery). The
committed message carries the user's keys only. See docs/transactions.md.
"""
from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

from ferry.codec import (
    CHECK_IMMUNITY_MS,
    MSG_ID_BYTES,
    REAL_QUEUE_ID,
    REAL_TOPIC,
    TXN_GROUP,
    TXN_ID,
    MessageFlag,
    StoredMessage,
    encode_properties,
    msg_id_hex,
)
from ferry.codec.system_properties import TXN_KEY_PREFIX
from ferry.codec.txn_op import COMMIT, ROLLBACK, TxnOp
from ferry.names import HALF_TOPIC, OP_TOPIC
from ferry.store import MessageIn, MessageStore

TXN_KEY_BYTES = len(TXN_KEY_PREFIX) + 2 * MSG_ID_BYTES
HALF_QUEUE_ID = 0
OP_QUEUE_ID = 0
#: The answer's `state` for each action.
STATES = {COMMIT: "committed", ROLLBACK: "rolled_back"}
# Candidates read per lookup: one op per transaction on a broker, a half more than
# once only when a producer re-sent its begin; the rest is room for hash collisions.
MAX_LOOKUP = 8
_ALL_TIME_MS = (0, 2**62)
_TXN_HALF = int(MessageFlag.TXN_HALF)
# Properties that only make sense on the half: dropped from the committed message.
_HALF_ONLY = (TXN_GROUP, CHECK_IMMUNITY_MS, REAL_TOPIC, REAL_QUEUE_ID)


def txn_key(msg_id: bytes) -> str:
    """The index key under which a transaction's half and op records are stored."""
    return TXN_KEY_PREFIX + msg_id_hex(msg_id)


def with_txn_key(keys: str, msg_id: bytes) -> str:
    """The half's keys: the user's, then the transaction key (always last)."""
    key = txn_key(msg_id)
    return f"{keys} {key}" if keys else key


def user_keys(half_keys: str, msg_id: bytes) -> str:
    """The half's keys without the transaction key the hook appended last."""
    key = txn_key(msg_id)
    if half_keys == key:
        return ""
    if half_keys.endswith(" " + key):
        return half_keys[:-len(key) - 1]
    return half_keys


def _lookup(store: MessageStore, topic: str, msg_id: bytes) -> list[StoredMessage]:
    return store.query_by_key(topic, txn_key(msg_id), *_ALL_TIME_MS, max_count=MAX_LOOKUP)


def find_half(store: MessageStore, msg_id: bytes) -> StoredMessage | None:
    """The newest half record of the transaction, or None."""
    for msg in _lookup(store, HALF_TOPIC, msg_id):
        if msg.msg_id == msg_id:
            return msg
    return None


def find_op(store: MessageStore, msg_id: bytes) -> StoredMessage | None:
    """The op record that ended the transaction (the oldest, should there be two), or None."""
    hex_id = msg_id_hex(msg_id)
    found = None
    for msg in _lookup(store, OP_TOPIC, msg_id):  # newest first
        if msg.properties.get(TXN_ID) == hex_id:
            found = msg
    return found


def op_action(op: StoredMessage) -> str:
    """How an op record ended its transaction ("commit" or "rollback")."""
    return TxnOp.from_properties(op.properties).action


def op_message(half: StoredMessage, action: str, by: str, born_host: str) -> MessageIn:
    """The `%OP%` record that ends `half`'s transaction (a fresh id; the store assigns it).

    `born_host` is whoever sent the END_TRANSACTION.
    """
    hex_id = msg_id_hex(half.msg_id)
    hp = half.properties
    op = TxnOp(hex_id, action, by, half.queue_offset, hp.get(TXN_GROUP, ""),
               hp.get(REAL_TOPIC, ""), hp.get(REAL_QUEUE_ID, ""))
    return MessageIn(OP_TOPIC, OP_QUEUE_ID, hex_id.encode(), tags=action,
                     keys=txn_key(half.msg_id), properties=encode_properties(op.to_properties()),
                     born_ts_ms=int(time.time() * 1000), born_host=born_host,
                     prepared_offset=half.phy_offset)


def real_destination(half: StoredMessage) -> tuple[str, int]:
    """The topic and queue the half's message goes to when committed."""
    props = half.properties
    return props[REAL_TOPIC], int(props[REAL_QUEUE_ID])


def committed_message(half: StoredMessage) -> MessageIn:
    """The real message of a committed half: same id, tags, body; user keys and properties."""
    topic, queue_id = real_destination(half)
    props = {k: v for k, v in half.properties.items() if k not in _HALF_ONLY}
    return MessageIn(topic, queue_id, bytes(half.body), half.tags,
                     user_keys(half.keys, half.msg_id), encode_properties(props), half.msg_id,
                     half.flags & ~_TXN_HALF, half.born_ts_ms, half.born_host,
                     prepared_offset=half.phy_offset)


@dataclass
class TxnStats:
    """What /v1/stats reports about transactions (since the broker started)."""

    halves_stored: int = 0
    ended: Counter[str] = field(default_factory=Counter)   # "committed" / "rolled_back"
    repeated_ends: int = 0
    checks: Counter[str] = field(default_factory=Counter)  # forwarded / no_producer / ended

    def as_dict(self) -> dict[str, object]:
        return {"halves_stored": self.halves_stored,
                "committed": self.ended["committed"], "rolled_back": self.ended["rolled_back"],
                "repeated_ends": self.repeated_ends,
                "checks_forwarded": self.checks["forwarded"],
                "checks_without_producer": self.checks["no_producer"],
                "checks_of_ended": self.checks["ended"]}
