"""The transaction hook: a TXN_HALF message is stored in `%HALF%` as a half message.

The half keeps its id (the transaction id), tags, body and properties;
`REAL_TOPIC` / `REAL_QUEUE_ID` say where END_TRANSACTION commits it, and the
key `TXN:<id>` is appended to its keys so that the broker finds it again by
the store's key index (see `transactions`). `%HALF%` is internal: no client
SENDs to it, no consumer subscribes to it (only the txn-checker reads it), so
a half is invisible until committed.

Refused with MalformedRequestError: a half without `TXN_GROUP` (or with a name
that breaks the group rules), without a message id (the producer names the
transaction), with a `CHECK_IMMUNITY_MS` that is not a number of milliseconds
within bounds, keys that leave no room for the transaction key, and a half
also flagged DELAY (a delayed commit would need the
scheduler to hold committed messages: not supported; delay the local
transaction instead). This hook runs before the delay hook for that reason.
"""
from __future__ import annotations

from ferry.codec import (
    CHECK_IMMUNITY_MS,
    MAX_KEYS_BYTES,
    NO_MSG_ID,
    TXN_GROUP,
    MessageFlag,
)
from ferry.errors import FerryError, MalformedRequestError
from ferry.names import HALF_TOPIC, validate_group
from ferry.store import MessageIn, decode_properties

from ferry_broker.put_pipeline import PutBatch, PutHook, redirected
from ferry_broker.topics import TopicManager
from ferry_broker.transactions import HALF_QUEUE_ID, TXN_KEY_BYTES, TxnStats, with_txn_key

_TXN_HALF = int(MessageFlag.TXN_HALF)
_DELAY = int(MessageFlag.DELAY)
#: The longest a producer may ask the checker to leave its half alone (one day).
MAX_CHECK_IMMUNITY_MS = 86_400_000


def check_half(msg: MessageIn, props: dict[str, str]) -> None:
    """Refuse a half message the broker could not end or check later."""
    if msg.flags & _DELAY:
        raise MalformedRequestError("a transactional half message cannot also be delayed "
                                    "(TXN_HALF with DELAY)")
    if not msg.msg_id or msg.msg_id == NO_MSG_ID:
        raise MalformedRequestError("a transactional half message needs its msg_id "
                                    "(the transaction id)")
    if len(msg.keys.encode()) + 1 + TXN_KEY_BYTES > MAX_KEYS_BYTES:
        raise MalformedRequestError(f"a transactional message's keys may take at most "
                                    f"{MAX_KEYS_BYTES - 1 - TXN_KEY_BYTES} bytes (the broker "
                                    f"adds its own key)")
    try:
        validate_group(props.get(TXN_GROUP))
    except FerryError as exc:
        raise MalformedRequestError(f"a transactional half message needs a valid "
                                    f"{TXN_GROUP} property: {exc}") from None
    raw = props.get(CHECK_IMMUNITY_MS)
    if raw is not None:
        try:
            ok = 0 <= int(raw) <= MAX_CHECK_IMMUNITY_MS
        except ValueError:
            ok = False
        if not ok:
            raise MalformedRequestError(f"{CHECK_IMMUNITY_MS} must be 0..{MAX_CHECK_IMMUNITY_MS} "
                                        f"milliseconds, not {raw!r}")


def to_half(msg: MessageIn, props: dict[str, str]) -> MessageIn:
    """`msg` as stored in `%HALF%`: the same id and parts, its destination in properties."""
    return redirected(msg, props, HALF_TOPIC, HALF_QUEUE_ID,
                      keys=with_txn_key(msg.keys, msg.msg_id))


class TxnHook(PutHook):
    """Redirects TXN_HALF-flagged messages to `%HALF%`."""

    def __init__(self, topics: TopicManager, stats: TxnStats) -> None:
        self._topics = topics
        self._stats = stats

    def before_put(self, batch: PutBatch) -> None:
        msgs = batch.messages
        halves: list[tuple[int, MessageIn]] = []
        for i, msg in enumerate(msgs):
            if msg.flags & _TXN_HALF:
                props = decode_properties(msg.properties)
                check_half(msg, props)
                halves.append((i, to_half(msg, props)))
        if not halves:
            return
        # Registers %HALF% here (once per broker), so that namesrv routes it to the checker.
        self._topics.queues_for_send(HALF_TOPIC)
        for i, half in halves:  # only once every entry passed: a refusal changes nothing
            msgs[i] = half
        self._stats.halves_stored += len(halves)
