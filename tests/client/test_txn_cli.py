"""`ferry txn list|describe` against a small real HTTP server playing the txn-checker."""
from __future__ import annotations

import asyncio
import os
import socket
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web

FERRY = str(Path(sys.executable).with_name("ferry"))
OPEN_ID = "0A" * 16
GONE_ID = "0B" * 16
TXNS = {
    "open": [{"msg_id": OPEN_ID, "group": "orders-tx", "topic": "orders", "broker": "b1",
              "state": "open", "checks": 2}],
    "discarded": [{"msg_id": GONE_ID, "group": "orders-tx", "topic": "orders", "broker": "b1",
                   "state": "discarded", "checks": 15}],
}


async def list_txns(request: web.Request) -> web.Response:
    state = request.query.get("state", "open")
    assert request.query.get("limit") == "100"
    return web.json_response({"state": state, "total": 1, "transactions": TXNS[state]})


async def describe_txn(request: web.Request) -> web.Response:
    for txn in TXNS["open"] + TXNS["discarded"]:
        if txn["msg_id"] == request.match_info["msg_id"]:
            return web.json_response(txn)
    return web.json_response({"error": {"code": 12, "type": "MessageNotFoundError",
                                        "message": "no transaction " +
                                                   request.match_info["msg_id"]}}, status=404)


@pytest.fixture
async def checker() -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_get("/v1/transactions", list_txns)
    app.router.add_get("/v1/transactions/{msg_id}", describe_txn)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield f"127.0.0.1:{port}"
    await runner.cleanup()


async def ferry(addr: str, *args: str) -> tuple[int, str, str]:
    env = {**os.environ, "FERRY_TXN_CHECKER": addr}
    proc = await asyncio.create_subprocess_exec(FERRY, "txn", *args, env=env,
                                                stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_list_open_and_discarded(checker: str) -> None:
    code, out, err = await ferry(checker, "list")
    assert code == 0, err
    assert OPEN_ID in out and "group=orders-tx" in out and "checks=2" in out
    assert "total: 1 open" in out
    code, out, err = await ferry(checker, "list", "--discarded")
    assert code == 0, err
    assert GONE_ID in out and OPEN_ID not in out and "total: 1 discarded" in out


async def test_describe_and_unknown_id(checker: str) -> None:
    code, out, err = await ferry(checker, "describe", OPEN_ID.lower())
    assert code == 0, err
    assert f'"msg_id": "{OPEN_ID}"' in out
    code, out, err = await ferry(checker, "describe", "0C" * 16)
    assert code == 1
    assert "MessageNotFoundError" in err and "no transaction" in err
    code, out, err = await ferry(checker, "describe", "not-an-id")
    assert code == 1 and "32 hex" in err


async def test_unreachable_service_is_a_clear_error() -> None:
    with socket.socket() as s:   # a free port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code, out, err = await ferry(f"127.0.0.1:{port}", "list")
    assert code == 1
    assert "unreachable" in err and str(port) in err
