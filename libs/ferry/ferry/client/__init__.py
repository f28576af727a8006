"""ferry.client: the asyncio clients (aiokafka-style) and their values."""
from __future__ import annotations

from ferry.client.admin.admin import Admin, QueueInfo, QueueLag
from ferry.client.consuming.consumer import Consumer
from ferry.client.core.message import ConsumerRecord, Message, SendResult, TopicQueue
from ferry.client.producing.producer import Producer
from ferry.client.transactions.transaction import Transaction, TransactionProducer
from ferry.client.transactions.txn_checks import TxnState
from ferry.filter import Sql

__all__ = [
    "Admin",
    "Consumer",
    "ConsumerRecord",
    "Message",
    "Producer",
    "QueueInfo",
    "QueueLag",
    "SendResult",
    "Sql",
    "TopicQueue",
    "Transaction",
    "TransactionProducer",
    "TxnState",
]
