"""Topic `type` and group `broadcast_allowed`: what a topic or group takes, checked here.

As RocketMQ 5 checks a message against its topic's TopicMessageType, a SEND
to a typed topic is refused (MessageTypeMismatchError, not retriable) unless
every message is of the topic's kind:

| type | takes | refuses |
|---|---|---|
| `normal` (default) | every kind, as before types were enforced | nothing |
| `fifo` | messages with a key (the order group the producer hashes to a queue with `ordered=True`) | a message without a key, a delayed or a transactional one |
| `delay` | delayed messages (`delay_ms` / `deliver_at_ms`) | a message without a delay, a transactional one |
| `transaction` | transactional halves (`TransactionProducer`) | every other message |

Only SEND is checked: the broker's own writes into a topic (DELIVER_DUE of a
due delayed message, the committed message of a transaction, SEND_BACK) are
what the topic's type asks for. A SEND to a typed topic is decoded (no fast
path) so that each message can be checked.

A HEARTBEAT of a broadcasting consumer in a group whose config has
`broadcast_allowed` false is refused (BroadcastNotAllowedError): the member is
not registered, and the client's `Consumer.start` raises the error.
"""
from __future__ import annotations

from collections.abc import Iterable

from ferry.codec import MessageFlag
from ferry.errors import BroadcastNotAllowedError, MessageTypeMismatchError
from ferry.store import MessageIn

NORMAL, FIFO, DELAY, TRANSACTION = "normal", "fifo", "delay", "transaction"
_DELAY = int(MessageFlag.DELAY)
_TXN_HALF = int(MessageFlag.TXN_HALF)


def kind_of(msg: MessageIn) -> str:
    """What a message is, in the words of the refusal."""
    if msg.flags & _TXN_HALF:
        return "a transactional message"
    if msg.flags & _DELAY:
        return "a delayed message"
    return "a message with a key" if msg.keys else "a message without a key"


def _takes(topic_type: str, msg: MessageIn) -> bool:
    if topic_type == FIFO:
        return bool(msg.keys) and not msg.flags & (_DELAY | _TXN_HALF)
    if topic_type == DELAY:
        return bool(msg.flags & _DELAY) and not msg.flags & _TXN_HALF
    if topic_type == TRANSACTION:
        return bool(msg.flags & _TXN_HALF)
    return True


_WANTS = {FIFO: "messages with a key (their order group; send them with ordered=True)",
          DELAY: "delayed messages (delay_ms or deliver_at_ms)",
          TRANSACTION: "transactional messages (a TransactionProducer)"}


def check_send(topic: str, topic_type: str, messages: Iterable[MessageIn]) -> None:
    """Refuse a SEND with a message its topic's type does not take."""
    if topic_type == NORMAL:
        return
    for msg in messages:
        if not _takes(topic_type, msg):
            raise MessageTypeMismatchError(
                f"topic {topic} is of type {topic_type} and takes only {_WANTS[topic_type]}, "
                f"not {kind_of(msg)}")


def check_member(group: str, mode: str, broadcast_allowed: bool) -> None:
    """Refuse a broadcasting member of a group that does not allow broadcasting."""
    if mode == "broadcasting" and not broadcast_allowed:
        raise BroadcastNotAllowedError(
            f"group {group} does not allow broadcasting consumers (broadcast_allowed is "
            f"false): use mode clustering, or another group")
