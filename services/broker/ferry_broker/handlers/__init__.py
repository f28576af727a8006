"""Request handlers, one module per request family, and the table from code to handler."""
from __future__ import annotations

from ferry.errors import StoreError
from ferry.wire import Frame, RequestCode

from ferry_broker.context import BrokerContext, ConnInfo, Handler
from ferry_broker.handlers.clients import (
    handle_get_consumers,
    handle_heartbeat,
    handle_unregister,
)
from ferry_broker.handlers.deliver import handle_deliver_due
from ferry_broker.handlers.identify import handle_identify
from ferry_broker.handlers.locks import handle_lock, handle_unlock
from ferry_broker.handlers.offsets import (
    handle_commit_offset,
    handle_get_min_max,
    handle_offset_for_time,
    handle_query_offset,
)
from ferry_broker.handlers.pull import handle_pull
from ferry_broker.handlers.query import handle_query_by_id, handle_query_by_key
from ferry_broker.handlers.send import handle_send
from ferry_broker.handlers.send_back import handle_send_back
from ferry_broker.handlers.transactions import (
    handle_check_transaction,
    handle_end_transaction,
)


def hide_store_errors(handler: Handler) -> Handler:
    """`handler`, answering a StoreError with a generic message (the detail is logged)."""

    async def run(ctx: BrokerContext, conn: ConnInfo, req: Frame) -> Frame | None:
        try:
            return await handler(ctx, conn, req)
        except StoreError as exc:
            raise ctx.health.hide(exc) from None

    run.__name__ = run.__qualname__ = handler.__name__
    return run


# SEND, SEND_BACK and DELIVER_DUE handle store failures themselves, in the put
# pipeline (StoreUnavailableError); the clients' handlers do not touch the store.
HANDLERS: dict[int, Handler] = {
    RequestCode.IDENTIFY: handle_identify,
    RequestCode.SEND: handle_send,
    RequestCode.SEND_BACK: handle_send_back,
    RequestCode.DELIVER_DUE: handle_deliver_due,
    RequestCode.PULL: hide_store_errors(handle_pull),
    RequestCode.COMMIT_OFFSET: hide_store_errors(handle_commit_offset),
    RequestCode.QUERY_OFFSET: handle_query_offset,
    RequestCode.GET_MIN_MAX: hide_store_errors(handle_get_min_max),
    RequestCode.OFFSET_FOR_TIME: hide_store_errors(handle_offset_for_time),
    RequestCode.QUERY_BY_ID: hide_store_errors(handle_query_by_id),
    RequestCode.QUERY_BY_KEY: hide_store_errors(handle_query_by_key),
    RequestCode.HEARTBEAT: handle_heartbeat,
    RequestCode.UNREGISTER: handle_unregister,
    RequestCode.GET_CONSUMERS: handle_get_consumers,
    RequestCode.LOCK: handle_lock,
    RequestCode.UNLOCK: handle_unlock,
    # END_TRANSACTION writes through the put pipeline (which answers a store that
    # refuses writes); its lookups before, and CHECK's, read the store.
    RequestCode.END_TRANSACTION: hide_store_errors(handle_end_transaction),
    RequestCode.CHECK_TRANSACTION: hide_store_errors(handle_check_transaction),
}

__all__ = ["HANDLERS"]
