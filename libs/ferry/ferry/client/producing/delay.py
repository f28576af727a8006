"""HTTP client of the delay scheduler, for `Producer.cancel_delayed`.

The scheduler's API is `POST /v1/delayed/{msg_id}/cancel`: 200 cancelled (the
message will never be delivered), 409 already delivered
(AlreadyDeliveredError), 404 unknown id (MessageNotFoundError), 503 this
instance is not the one holding the message: its error body may name the
`leader` to ask instead (without one: busy, e.g. the message is being
delivered right now, so the same address is asked again shortly, which then
answers 200 or 409). Error bodies have namesrv's shape
(`{"error": {"code", "type", "message"}}`) and map to `ferry.errors` classes
the same way (`namesrv.http_error`).

Addresses: `delay_scheduler` ("h:p,h:p"), else env `FERRY_DELAY_SCHEDULER`,
else 127.0.0.1:10922. Each is tried in turn (a named leader first).
"""
from __future__ import annotations

import asyncio
import os
import re
from collections.abc import Mapping
from typing import Any

from ferry.auth.credentials import Credentials
from ferry.client.core.namesrv import HttpApi, http_error, parse_namesrv
from ferry.errors import (
    AlreadyDeliveredError,
    BusyError,
    ConnectionLostError,
    FerryError,
    MalformedRequestError,
    MessageNotFoundError,
    RequestTimeoutError,
)

DEFAULT_DELAY_SCHEDULER = "127.0.0.1:10922"
DELAY_SCHEDULER_ENV = "FERRY_DELAY_SCHEDULER"
CANCEL_TIMEOUT_MS = 5_000
#: Requests one cancel may make (each address once, plus leaders it is pointed to).
MAX_CANCEL_ATTEMPTS = 8
#: Wait before asking a busy scheduler (503 without a leader) again.
BUSY_RETRY_MS = 200
_MSG_ID = re.compile(r"[0-9A-Fa-f]{32}")
_BY_STATUS: Mapping[int, type[FerryError]] = {
    404: MessageNotFoundError, 409: AlreadyDeliveredError, 503: BusyError}


def default_delay_scheduler() -> str:
    return os.environ.get(DELAY_SCHEDULER_ENV, DEFAULT_DELAY_SCHEDULER)


class DelaySchedulerClient:
    """Cancels delayed messages at the delay scheduler (the session opens on first use)."""

    def __init__(self, addrs: str | None = None, *, timeout_ms: int = CANCEL_TIMEOUT_MS,
                 credentials: Credentials | None = None) -> None:
        """`credentials` sign the requests (default: FERRY_ACCESS_KEY / FERRY_SECRET_KEY)."""
        self._api = HttpApi(addrs or default_delay_scheduler(), name="delay scheduler",
                            timeout_ms=timeout_ms, credentials=credentials,
                            by_status=_BY_STATUS)

    async def close(self) -> None:
        await self._api.close()

    async def cancel(self, msg_id: str) -> None:
        """Cancel `msg_id` (32 hex characters); raises what the scheduler answered."""
        if not isinstance(msg_id, str) or not _MSG_ID.fullmatch(msg_id):
            raise MalformedRequestError(f"msg_id must be 32 hex characters, got {msg_id!r}")
        todo = list(self._api.urls)
        last: FerryError | None = None
        for _ in range(MAX_CANCEL_ATTEMPTS):
            if not todo:
                break
            base = todo.pop(0)
            url = f"{base}/v1/delayed/{msg_id.upper()}/cancel"
            try:
                status, data = await self._api.attempt("POST", url)
            except (RequestTimeoutError, ConnectionLostError) as exc:
                last = exc
                continue
            if status == 200:
                return
            err = http_error(status, data, url, _BY_STATUS)
            if status < 500:
                raise err
            last = err
            leader = _leader(data)
            if leader and leader not in todo:
                todo.insert(0, leader)
            elif status == 503 and not leader:
                todo.append(base)   # busy: ask again after the others
                await asyncio.sleep(BUSY_RETRY_MS / 1000)
        assert last is not None
        raise last


def _leader(data: Any) -> str | None:
    """The base URL of the leader a 503 answer names, if any."""
    err = data.get("error") if isinstance(data, dict) else None
    leader = err.get("leader") if isinstance(err, dict) else None
    if not isinstance(leader, str) or not leader:
        return None
    return parse_namesrv(leader)[0]
