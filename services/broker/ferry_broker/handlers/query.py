"""Message query: by message id and by key, answered with the stored records.

Both answer the records exactly as stored, back to back in the body (like a
PULL), with `count` in the fields. An unknown id is MessageNotFoundError; a
key with no message is an empty answer. An answer holds at most
MAX_QUERY_BYTES of records (newest first for a key): `count` may be below
`max_count`.
"""
from __future__ import annotations

from ferry.codec.limits import MSG_ID_BYTES
from ferry.errors import MalformedRequestError, MessageNotFoundError
from ferry.store import MessageStore, StoredMessage
from ferry.wire import Frame, response

from ferry_broker.context import BrokerContext, ConnInfo
from ferry_broker.handlers.fields import MAX_OFFSET, int_field, str_field, topic_field

MAX_QUERY_COUNT = 64
MAX_KEY_CHARS = 1024
# A query answer stops before this many bytes of records (the first record always
# goes: one record is at most 4 MiB), well under the 16 MiB frame limit.
MAX_QUERY_BYTES = 8 << 20


def parse_msg_id(value: object) -> bytes:
    """A message id from its 16 bytes or its 32 hex characters."""
    if isinstance(value, bytes) and len(value) == MSG_ID_BYTES:
        return value
    if isinstance(value, str) and len(value) == 2 * MSG_ID_BYTES:
        try:
            return bytes.fromhex(value)
        except ValueError:
            pass
    raise MalformedRequestError(f"field 'msg_id' must be {MSG_ID_BYTES} bytes or "
                                f"{2 * MSG_ID_BYTES} hex characters, not {value!r}")


def raw_record(store: MessageStore, msg: StoredMessage) -> bytes | None:
    """The stored bytes of `msg`, straight from the commit log (CRC-checked).

    Not through its queue entry: retention may have moved the queue's minimum
    past a record the commit log still holds.
    """
    return store.read_raw(msg.phy_offset)


def _records_response(req: Frame, store: MessageStore, msgs: list[StoredMessage]) -> Frame:
    """The records of `msgs` (in order) up to MAX_QUERY_BYTES; `count` says how many fit."""
    raws: list[bytes] = []
    total = 0
    for msg in msgs:
        if raws and total + msg.size > MAX_QUERY_BYTES:
            break  # checked before reading: the body never grows past the cap
        raw = raw_record(store, msg)
        if raw is not None:
            raws.append(raw)
            total += len(raw)
    return response(req, {"count": len(raws)}, b"".join(raws))


async def handle_query_by_id(ctx: BrokerContext, conn: ConnInfo, req: Frame) -> Frame:
    msg_id = parse_msg_id(req.fields.get("msg_id"))
    msg = ctx.store.query_by_id(msg_id)
    if msg is None:
        raise MessageNotFoundError(f"no message with id {msg_id.hex().upper()}")
    return _records_response(req, ctx.store, [msg])


async def handle_query_by_key(ctx: BrokerContext, conn: ConnInfo, req: Frame) -> Frame:
    f = req.fields
    topic = topic_field(f)
    key = str_field(f, "key", MAX_KEY_CHARS)
    if not key or " " in key:
        raise MalformedRequestError("field 'key' must be one non-empty key without spaces")
    begin_ms = int_field(f, "begin_ms", 0, MAX_OFFSET, 0)
    end_ms = int_field(f, "end_ms", 0, MAX_OFFSET, MAX_OFFSET)
    max_count = int_field(f, "max_count", 1, MAX_QUERY_COUNT, MAX_QUERY_COUNT)
    msgs = ctx.store.query_by_key(topic, key, begin_ms, end_ms, max_count=max_count)
    return _records_response(req, ctx.store, msgs)
