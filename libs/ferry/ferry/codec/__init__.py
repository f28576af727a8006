"""The shared formats of Ferry: what the store, the wire and the clients all read and write.

A leaf package like `ferry.errors` and `ferry.names`: it imports nothing else
of Ferry, so that `ferry.store`, `ferry.wire` and `ferry.client` can all
depend on it without depending on each other. Modules: `record` (the
commit-log record, fields by name), `entry` (the SEND entry, also the store's
batch input), `properties`, `tags`, `msg_id`, `limits` (every limit once),
`message_flags` and `system_properties`.
"""
from __future__ import annotations

from ferry.codec.entry import ENTRY_HEAD, ENTRY_HEAD_FIELDS, ENTRY_HEAD_SIZE, append_entry
from ferry.codec.limits import (
    MAX_BODY_BYTES,
    MAX_HOST_BYTES,
    MAX_KEYS_BYTES,
    MAX_PROPERTIES_BYTES,
    MAX_QUEUE_ID,
    MAX_QUEUES,
    MAX_TAGS_BYTES,
    MAX_TOPIC_BYTES,
    MSG_ID_BYTES,
)
from ferry.codec.message_flags import HOOKED_FLAGS, MessageFlag
from ferry.codec.msg_id import NO_MSG_ID, msg_id_hex, new_msg_id
from ferry.codec.properties import decode_properties, encode_properties
from ferry.codec.record import (
    HEADER,
    HEADER_FIELDS,
    HEADER_SIZE,
    MessageIn,
    StoredMessage,
    check_record,
    check_records,
    decode_record,
    encode_record,
    iter_records,
)
from ferry.codec.system_properties import (
    CHECK_IMMUNITY_MS,
    DELIVER_AT_MS,
    HALF_OFFSET,
    ORIGIN_OFFSET,
    ORIGIN_TOPIC,
    REAL_QUEUE_ID,
    REAL_TOPIC,
    RECONSUME_TIMES,
    SYSTEM_PROPERTIES,
    TRACEPARENT,
    TRACESTATE,
    TTL_MS,
    TXN_ACTION,
    TXN_BY,
    TXN_GROUP,
    TXN_ID,
)
from ferry.codec.tags import tag_hash

__all__ = [
    # the record
    "HEADER", "HEADER_FIELDS", "HEADER_SIZE", "MessageIn", "StoredMessage", "check_record", "check_records",
    "decode_record", "encode_record", "iter_records",
    # the SEND entry
    "ENTRY_HEAD", "ENTRY_HEAD_FIELDS", "ENTRY_HEAD_SIZE", "append_entry",
    # properties, tags, message ids
    "encode_properties", "decode_properties", "tag_hash", "NO_MSG_ID", "new_msg_id", "msg_id_hex",
    # limits
    "MAX_BODY_BYTES", "MAX_HOST_BYTES", "MAX_KEYS_BYTES", "MAX_PROPERTIES_BYTES", "MAX_QUEUE_ID",
    "MAX_QUEUES", "MAX_TAGS_BYTES", "MAX_TOPIC_BYTES", "MSG_ID_BYTES",
    # message flags
    "HOOKED_FLAGS", "MessageFlag",
    # system property names
    "DELIVER_AT_MS", "ORIGIN_OFFSET", "ORIGIN_TOPIC", "REAL_QUEUE_ID", "REAL_TOPIC",
    "RECONSUME_TIMES", "SYSTEM_PROPERTIES", "TTL_MS", "TRACEPARENT", "TRACESTATE",
    "CHECK_IMMUNITY_MS", "HALF_OFFSET", "TXN_ACTION", "TXN_BY", "TXN_GROUP", "TXN_ID",
]
