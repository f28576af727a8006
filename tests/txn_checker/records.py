"""Building %HALF% and %OP% records as a broker stores them, for the unit tests."""
from __future__ import annotations

from ferry.codec import (
    CHECK_IMMUNITY_MS,
    HALF_OFFSET,
    REAL_QUEUE_ID,
    REAL_TOPIC,
    TXN_ACTION,
    TXN_BY,
    TXN_GROUP,
    TXN_ID,
    MessageIn,
    StoredMessage,
    decode_record,
    encode_properties,
    encode_record,
    msg_id_hex,
    new_msg_id,
)
from ferry.names import HALF_TOPIC, OP_TOPIC


def _stored(msg: MessageIn, queue_offset: int, store_ms: int) -> StoredMessage:
    raw = encode_record(msg, queue_offset=queue_offset, phy_offset=queue_offset * 1000,
                        store_ts_ms=store_ms)
    return decode_record(raw)


def raw(rec: StoredMessage) -> bytes:
    """`rec` as a PULL body carries it (the record's bytes as stored)."""
    msg = MessageIn(rec.topic, rec.queue_id, bytes(rec.body), rec.tags, rec.keys,
                    bytes(rec.properties_raw), rec.msg_id, rec.flags)
    return encode_record(msg, queue_offset=rec.queue_offset, phy_offset=rec.phy_offset,
                         store_ts_ms=rec.store_ts_ms)


def half(queue_offset: int, store_ms: int, *, group: str = "g", topic: str = "orders",
         immunity_ms: int | None = None, msg_id: bytes | None = None) -> StoredMessage:
    props = {TXN_GROUP: group, REAL_TOPIC: topic, REAL_QUEUE_ID: "0"}
    if immunity_ms is not None:
        props[CHECK_IMMUNITY_MS] = str(immunity_ms)
    msg = MessageIn(HALF_TOPIC, 0, b"body", properties=encode_properties(props),
                    msg_id=msg_id or new_msg_id())
    return _stored(msg, queue_offset, store_ms)


def op(queue_offset: int, of: StoredMessage, action: str = "commit", by: str = "producer",
       store_ms: int | None = None) -> StoredMessage:
    props = {TXN_ID: msg_id_hex(of.msg_id), TXN_ACTION: action, TXN_BY: by,
             HALF_OFFSET: str(of.queue_offset), TXN_GROUP: of.properties[TXN_GROUP],
             REAL_TOPIC: of.properties[REAL_TOPIC], REAL_QUEUE_ID: "0"}
    msg = MessageIn(OP_TOPIC, 0, msg_id_hex(of.msg_id).encode(),
                    properties=encode_properties(props))
    return _stored(msg, queue_offset, store_ms if store_ms is not None else of.store_ts_ms + 1)
