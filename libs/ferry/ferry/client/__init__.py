"""ferry.client: the asyncio clients (aiokafka-style) and their values."""
from __future__ import annotations

from ferry.client.admin import Admin, QueueInfo, QueueLag
from ferry.client.consumer import Consumer
from ferry.client.message import ConsumerRecord, Message, SendResult, TopicQueue
from ferry.client.producer import Producer
from ferry.client.transaction import Transaction, TransactionProducer
from ferry.client.txn_checks import TxnState
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
