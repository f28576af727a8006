"""Ferry: a distributed message middleware in the RocketMQ tradition.

The public client API lives here: `Producer`, `TransactionProducer`, `Consumer` and
`Admin` (asyncio, aiokafka-style), the values they exchange, `Credentials` (the identity
they sign requests with), and the error classes.
"""
from __future__ import annotations

from typing import Any

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
from ferry.client.consuming.idempotence_hook import Handler, use_idempotence_wiring
from ferry.client.core.trace_topic import TraceTopicExporter
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
from ferry.telemetry.setup import use_trace_topic_exporter

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
# `setup_tracing(..., namesrv=...)` exports spans to that cluster's %TRACE% topic too: the
# exporter is a client of the topic, telemetry (below the client) is given it here.
use_trace_topic_exporter(TraceTopicExporter)


def _wire_idempotence(handler: Handler, check: object, *, group: str,
                      stats: Any) -> tuple[Handler, Any]:
    """`consumer.run(..., idempotence=...)`: ferry.idempotence, which builds on the client,
    loaded at the first idempotent run (see ferry.client.consuming.idempotence_hook)."""
    from ferry.idempotence.wiring import wire_run
    return wire_run(handler, check, group=group, stats=stats)


use_idempotence_wiring(_wire_idempotence)
