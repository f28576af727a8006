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
from collections.abc import Mapping
from typing import Any

import aiohttp

from ferry.auth.credentials import Credentials
from ferry.auth.http import client_session
from ferry.client.namesrv import http_error, parse_namesrv, read_json
from ferry.errors import (
    ConnectionLostError,
    FerryError,
    MalformedRequestError,
    MessageNotFoundError,
    RequestTimeoutError,
)

DEFAULT_TXN_CHECKER = "127.0.0.1:10923"
TXN_CHECKER_ENV = "FERRY_TXN_CHECKER"
TXN_CHECKER_TIMEOUT_MS = 5_000
TXN_STATES = ("open", "discarded")
#: The most transactions one list asks for (the service's own bound).
MAX_LIST_LIMIT = 1000
_MSG_ID = re.compile(r"[0-9A-Fa-f]{32}")
_BY_STATUS: Mapping[int, type[FerryError]] = {404: MessageNotFoundError}


def default_txn_checker() -> str:
    return os.environ.get(TXN_CHECKER_ENV, DEFAULT_TXN_CHECKER)


class TxnCheckerClient:
    """Reads the txn-checker's view of transactions. Use `async with TxnCheckerClient():`."""

    def __init__(self, addrs: str | None = None, *,
                 timeout_ms: int = TXN_CHECKER_TIMEOUT_MS,
                 credentials: Credentials | None = None) -> None:
        """`credentials` sign the requests (default: FERRY_ACCESS_KEY / FERRY_SECRET_KEY)."""
        self.urls = parse_namesrv(addrs or default_txn_checker())
        self.timeout_ms = timeout_ms
        self.credentials = credentials if credentials is not None else Credentials.from_env()
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> TxnCheckerClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()

    async def list(self, state: str = "open",
                   limit: int = 100) -> tuple[list[dict[str, Any]], int]:
        """Open transactions (halves with no op record yet), or the discarded ones
        (newest first): up to `limit` of them, and how many there are in all."""
        if state not in TXN_STATES:
            raise MalformedRequestError(f"state must be one of {TXN_STATES}, got {state!r}")
        if not 1 <= limit <= MAX_LIST_LIMIT:
            raise MalformedRequestError(f"limit must be 1..{MAX_LIST_LIMIT}, got {limit}")
        data = await self._get("/v1/transactions", {"state": state, "limit": str(limit)})
        items = data.get("transactions", []) if isinstance(data, dict) else data
        txns = [t for t in items if isinstance(t, dict)] if isinstance(items, list) else []
        total = data.get("total") if isinstance(data, dict) else None
        return txns, total if isinstance(total, int) else len(txns)

    async def describe(self, msg_id: str) -> dict[str, Any]:
        """One transaction by id; MessageNotFoundError when the service knows none."""
        if not isinstance(msg_id, str) or not _MSG_ID.fullmatch(msg_id):
            raise MalformedRequestError(f"a transaction id is 32 hex characters, got {msg_id!r}")
        data = await self._get(f"/v1/transactions/{msg_id.upper()}")
        if not isinstance(data, dict):
            raise FerryError(f"txn-checker answered {data!r}, not an object")
        return data

    async def _get(self, path: str, params: dict[str, str] | None = None) -> Any:
        if self._session is None:
            self._session = client_session(
                self.credentials,
                timeout=aiohttp.ClientTimeout(total=self.timeout_ms / 1000))
        last: FerryError | None = None
        for base in self.urls:
            url = base + path
            try:
                async with self._session.get(url, params=params) as resp:
                    data = await read_json(resp)
                    if resp.status < 400:
                        return data
                    err = http_error(resp.status, data, url, _BY_STATUS)
                    if resp.status < 500:
                        raise err
                    last = err
            except TimeoutError:
                last = RequestTimeoutError(f"txn-checker {url} did not answer in "
                                           f"{self.timeout_ms} ms")
            except aiohttp.ClientError as exc:
                last = ConnectionLostError(f"txn-checker {url} unreachable: {exc}")
        assert last is not None
        raise last
