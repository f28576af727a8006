"""HTTP client of the txn-checker service, for `ferry txn list` and `ferry txn describe`.

The service's API: `GET /v1/transactions?state=open|discarded&limit=N`
(`{"state", "total", "transactions": [...]}`) and
`GET /v1/transactions/{msg_id}` (one transaction; 404 when it knows no such
id). Error bodies have namesrv's shape (`{"error": {"code", "type",
"message"}}`) and map to `ferry.errors` classes (`namesrv.http_error`).

Addresses: `addrs` ("h:p,h:p"), else env `FERRY_TXN_CHECKER`, else
127.0.0.1:10923; each is tried in turn until one answers.
"""
from __future__ import annotations

import os
import re
from typing import Any

from ferry.auth.credentials import Credentials
from ferry.client.core.namesrv import HttpApi
from ferry.errors import (
    FerryError,
    MalformedRequestError,
    MessageNotFoundError,
)

DEFAULT_TXN_CHECKER = "127.0.0.1:10923"
TXN_CHECKER_ENV = "FERRY_TXN_CHECKER"
TXN_CHECKER_TIMEOUT_MS = 5_000
TXN_STATES = ("open", "discarded")
#: The most transactions one list asks for (the service's own bound).
MAX_LIST_LIMIT = 1000
_MSG_ID = re.compile(r"[0-9A-Fa-f]{32}")


def default_txn_checker() -> str:
    return os.environ.get(TXN_CHECKER_ENV, DEFAULT_TXN_CHECKER)


class TxnCheckerClient(HttpApi):
    """Reads the txn-checker's view of transactions. Use `async with TxnCheckerClient():`."""

    def __init__(self, addrs: str | None = None, *,
                 timeout_ms: int = TXN_CHECKER_TIMEOUT_MS,
                 credentials: Credentials | None = None) -> None:
        """`credentials` sign the requests (default: FERRY_ACCESS_KEY / FERRY_SECRET_KEY)."""
        super().__init__(addrs or default_txn_checker(), name="txn-checker",
                         timeout_ms=timeout_ms, credentials=credentials,
                         by_status={404: MessageNotFoundError})

    async def list(self, state: str = "open",
                   limit: int = 100) -> tuple[list[dict[str, Any]], int]:
        """Open transactions (halves with no op record yet), or the discarded ones
        (newest first): up to `limit` of them, and how many there are in all."""
        if state not in TXN_STATES:
            raise MalformedRequestError(f"state must be one of {TXN_STATES}, got {state!r}")
        if not 1 <= limit <= MAX_LIST_LIMIT:
            raise MalformedRequestError(f"limit must be 1..{MAX_LIST_LIMIT}, got {limit}")
        data = await self.call("GET", "/v1/transactions",
                               params={"state": state, "limit": str(limit)})
        items = data.get("transactions", []) if isinstance(data, dict) else data
        txns = [t for t in items if isinstance(t, dict)] if isinstance(items, list) else []
        total = data.get("total") if isinstance(data, dict) else None
        return txns, total if isinstance(total, int) else len(txns)

    async def describe(self, msg_id: str) -> dict[str, Any]:
        """One transaction by id; MessageNotFoundError when the service knows none."""
        if not isinstance(msg_id, str) or not _MSG_ID.fullmatch(msg_id):
            raise MalformedRequestError(f"a transaction id is 32 hex characters, got {msg_id!r}")
        data = await self.call("GET", f"/v1/transactions/{msg_id.upper()}")
        if not isinstance(data, dict):
            raise FerryError(f"txn-checker answered {data!r}, not an object")
        return data
