"""ferry.store: the log store (commit log, consume queues, index, flush, recovery, retention).

Pure Python plus mmap: no asyncio, no sockets, nothing of Ferry but the leaves
(`codec`, `errors`, `names`), so the broker, the scheduler, Spark jobs and tools
can all open a store. The API is described in docs/internals.md, the files in
docs/store-format.md. The record codec re-exported here lives in `ferry.codec`.
"""
from __future__ import annotations

from ferry.codec.msg_id import new_msg_id
from ferry.codec.properties import decode_properties, encode_properties
from ferry.codec.record import MessageIn, StoredMessage, decode_record, encode_record, iter_records
from ferry.codec.tags import tag_hash

from .config import FlushMode, StoreConfig
from .message_store import MessageStore
from .recovery import RecoveryReport
from .results import BatchPutResult, GetResult, GetStatus, PutResult, PutStatus
from .retention import RetentionFloor, RetentionReport
from .topic_retention import TopicRetention

__all__ = [
    # the store and its configuration
    "MessageStore",
    "StoreConfig",
    "FlushMode",
    # appending
    "MessageIn",
    "PutResult",
    "PutStatus",
    "BatchPutResult",
    # reading
    "GetResult",
    "GetStatus",
    "StoredMessage",
    # the record codec (from ferry.codec, for the store's callers)
    "decode_record",
    "encode_record",
    "iter_records",
    "encode_properties",
    "decode_properties",
    "tag_hash",
    "new_msg_id",
    # maintenance reports
    "RecoveryReport",
    "RetentionReport",
    "RetentionFloor",
    "TopicRetention",
]
