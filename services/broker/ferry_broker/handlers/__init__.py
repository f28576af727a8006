"""Request handlers, one module per request family, and the table from code to handler."""
from __future__ import annotations

from ferry.wire import RequestCode

from ferry_broker.context import Handler
from ferry_broker.handlers.clients import (
    handle_get_consumers,
    handle_heartbeat,
    handle_unregister,
)
from ferry_broker.handlers.offsets import (
    handle_commit_offset,
    handle_get_min_max,
    handle_offset_for_time,
    handle_query_offset,
)
from ferry_broker.handlers.pull import handle_pull
from ferry_broker.handlers.query import handle_query_by_id, handle_query_by_key
from ferry_broker.handlers.send import handle_send

HANDLERS: dict[int, Handler] = {
    RequestCode.SEND: handle_send,
    RequestCode.PULL: handle_pull,
    RequestCode.COMMIT_OFFSET: handle_commit_offset,
    RequestCode.QUERY_OFFSET: handle_query_offset,
    RequestCode.GET_MIN_MAX: handle_get_min_max,
    RequestCode.OFFSET_FOR_TIME: handle_offset_for_time,
    RequestCode.QUERY_BY_ID: handle_query_by_id,
    RequestCode.QUERY_BY_KEY: handle_query_by_key,
    RequestCode.HEARTBEAT: handle_heartbeat,
    RequestCode.UNREGISTER: handle_unregister,
    RequestCode.GET_CONSUMERS: handle_get_consumers,
}

__all__ = ["HANDLERS"]
