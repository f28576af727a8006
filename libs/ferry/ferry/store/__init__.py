"""ferry.store: the log store (commit log, consume queues, index, flush, recovery, retention).

Pure Python plus mmap: no asyncio, no sockets, nothing of Ferry but errors and
names, so the broker, the scheduler, Spark jobs and tools can all open a store.
The API is described in docs/internals.md, the files in docs/store-format.md.
"""
from __future__ import annotations

from .config import FlushMode, StoreConfig
from .message_store import MessageStore
from .record import (
    MessageIn,
    StoredMessage,
    decode_properties,
    decode_record,
    encode_properties,
    encode_record,
    iter_records,
    new_msg_id,
    tag_hash,
)
from .recovery import RecoveryReport
from .results import BatchPutResult, GetResult, GetStatus, PutResult, PutStatus
from .retention import RetentionReport

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
    # the record codec (shared with clients decoding PULL bodies)
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
]
