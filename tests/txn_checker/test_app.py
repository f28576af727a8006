"""The txn-checker process: its HTTP API, errors in namesrv's shape, and the SIGTERM stop."""
from __future__ import annotations

import asyncio
import json

import pytest

from tests.client.conftest import Mesh, unique
from tests.txn_checker.conftest import start_txn_checker
from tests.txn_checker.fake_producer import FakeProducer
from tests.txn_checker.test_integration import until

pytestmark = pytest.mark.integration


async def test_api_lists_and_describes_and_a_sigterm_stop_keeps_the_open_set(
        txn_mesh: Mesh) -> None:
    checker = start_txn_checker(txn_mesh)
    for path in ("/healthz", "/readyz", "/openapi.json"):
        assert checker.get(path)[0] == 200, path
    paths = checker.get("/openapi.json")[1]["paths"]
    assert {"/v1/stats", "/v1/transactions", "/v1/transactions/{msg_id}"} <= set(paths)
    stats = checker.stats()
    for key in ("open", "checked", "committed_by_check", "rolled_back_by_check", "discarded"):
        assert stats[key] == 0, key

    status, body = checker.get("/v1/transactions/" + "AB" * 16)
    assert status == 404 and body["error"]["code"] == 12
    assert body["error"]["type"] == "MessageNotFoundError"
    for path in ("/v1/transactions?state=closed", "/v1/transactions?limit=0",
                 "/v1/transactions/not-an-id"):
        status, body = checker.get(path)
        assert status == 400 and body["error"]["type"] == "MalformedRequestError", path

    group = unique("tg")
    producer = await FakeProducer(txn_mesh.brokers["broker-a"].addr, group,
                                  lambda _id, _n: None).start()
    try:
        msg_id = await producer.begin(unique("tt"), b"later", CHECK_IMMUNITY_MS="600000")
        listed = await until(lambda: checker.get("/v1/transactions?state=open")[1]
                             ["transactions"], 20, "the half listed as open")
        assert [t["msg_id"] for t in listed] == [msg_id]
        status, txn = checker.get(f"/v1/transactions/{msg_id.lower()}")
        assert status == 200
        assert (txn["state"], txn["group"], txn["checks"], txn["immunity_ms"]) == (
            "open", group, 0, 600_000)
        await asyncio.sleep(0.5)  # a checkpoint interval: the stop must save it anyway

        checker.proc.stop()
        assert checker.proc.popen.returncode == 0, checker.proc.log()[-2000:]
        saved = json.loads((checker.data_dir / "checkpoint.json").read_bytes())
        assert [row[0] for row in saved["brokers"]["broker-a"]["open"]] == [msg_id]
        assert "txn-checker stopped" in checker.proc.log()

        checker = start_txn_checker(txn_mesh, http_port=checker.http_port)
        assert checker.get(f"/v1/transactions/{msg_id}")[1]["state"] == "open"
        assert checker.stats()["open"] == 1
    finally:
        await producer.stop()
        checker.proc.stop()
