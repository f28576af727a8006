"""Ferry: a distributed message middleware in the RocketMQ tradition.

The public client API lives here: `Producer`, `TransactionProducer`, `Consumer` and
`Admin` (asyncio, aiokafka-style), the values they exchange, `Credentials` (the identity
they sign requests with), and the error classes.
"""
from __future__ import annotations

from ferry import errors, kombu_alias
from ferry.auth.credentials import Credentials
from ferry.client import (
    Admin,
    Consumer,
    ConsumerRecord,
    Message,
    Producer,
    QueueInfo,
    QueueLag,
    SendResult,
    Sql,
    TopicQueue,
    Transaction,
    TransactionProducer,
    TxnState,
)
from ferry.errors import (
    AccessDeniedError,
    AlreadyDeliveredError,
    AuthenticationError,
    BroadcastNotAllowedError,
    ConnectionLostError,
    DiskFullError,
    FerryError,
    InvalidDelayError,
    MessageNotFoundError,
    MessageTooLargeError,
    MessageTypeMismatchError,
    RequestTimeoutError,
    TopicNotFoundError,
    TransactionStateError,
    error_for_code,
)

__version__ = "0.1.0"

__all__ = [
    "__version__",
    # clients
    "Producer",
    "TransactionProducer",
    "Consumer",
    "Admin",
    # values
    "Message",
    "SendResult",
    "ConsumerRecord",
    "Sql",
    "TopicQueue",
    "QueueInfo",
    "QueueLag",
    "Transaction",
    "TxnState",
    # identity (docs/security.md)
    "Credentials",
    # errors
    "errors",
    "FerryError",
    "ConnectionLostError",
    "RequestTimeoutError",
    "TopicNotFoundError",
    "MessageTooLargeError",
    "InvalidDelayError",
    "AlreadyDeliveredError",
    "MessageNotFoundError",
    "TransactionStateError",
    "AuthenticationError",
    "AccessDeniedError",
    "MessageTypeMismatchError",
    "BroadcastNotAllowedError",
    "DiskFullError",
    "error_for_code",
]

kombu_alias.install()   # `Celery(broker="ferry://...")` works once Ferry is imported
