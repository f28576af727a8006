"""LOCK and UNLOCK: queue locks for ordered consumers (the table is `queue_locks.py`).

LOCK grants or renews the asked queues that no other client of the group holds
and answers those now held by the asker with the lock's lifetime; UNLOCK
releases the asker's own. Neither touches the store.
"""
from __future__ import annotations

from typing import Any

from ferry.codec.limits import MAX_QUEUE_ID
from ferry.errors import MalformedRequestError
from ferry.wire import Frame, response

from ferry_broker.context import BrokerContext, ConnInfo
from ferry_broker.handlers.clients import MAX_CLIENT_ID_CHARS
from ferry_broker.handlers.fields import group_field, str_field, topic_field
from ferry_broker.queue_locks import MAX_LOCK_QUEUE_IDS


def _lock_fields(f: dict[str, Any]) -> tuple[str, str, str, list[int]]:
    """(group, client_id, topic, queue_ids) of a LOCK or UNLOCK request, checked."""
    group = group_field(f)
    client_id = str_field(f, "client_id", MAX_CLIENT_ID_CHARS)
    if not client_id:
        raise MalformedRequestError("field 'client_id' must not be empty")
    topic = topic_field(f)
    queue_ids = f.get("queue_ids")
    if not isinstance(queue_ids, list) or len(queue_ids) > MAX_LOCK_QUEUE_IDS:
        raise MalformedRequestError(f"field 'queue_ids' must be a list of at most "
                                    f"{MAX_LOCK_QUEUE_IDS} queue ids")
    for q in queue_ids:
        if type(q) is not int or not 0 <= q <= MAX_QUEUE_ID:
            raise MalformedRequestError(f"field 'queue_ids' holds {q!r}: queue ids are "
                                        f"integers within 0..{MAX_QUEUE_ID}")
    return group, client_id, topic, queue_ids


async def handle_lock(ctx: BrokerContext, conn: ConnInfo, req: Frame) -> Frame:
    group, client_id, topic, queue_ids = _lock_fields(req.fields)
    ctx.consumers.touch(client_id, group)
    locked = ctx.locks.lock(group, client_id, topic, queue_ids)
    return response(req, {"locked": locked, "expiry_ms": ctx.locks.expiry_ms})


async def handle_unlock(ctx: BrokerContext, conn: ConnInfo, req: Frame) -> Frame:
    group, client_id, topic, queue_ids = _lock_fields(req.fields)
    ctx.locks.unlock(group, client_id, topic, queue_ids)
    return response(req)
