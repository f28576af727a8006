"""The service spine: --help, HTTP endpoints, and a clean stop that answers parked pulls."""
from __future__ import annotations

import asyncio
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.broker.conftest import Broker, start_broker
from tests.broker.wire_client import message
from tests.support.procs import Etcd

pytestmark = pytest.mark.integration


def test_help_says_what_the_broker_owns() -> None:
    out = subprocess.run([sys.executable, "-m", "ferry_broker", "--help"], capture_output=True,
                         text=True, timeout=30, check=True).stdout
    for word in ("commit log", "long polling", "consumer_offsets.json", "--port", "--etcd",
                 "FERRY_BROKER_"):
        assert word in out


def test_bad_config_exits_with_a_clear_error() -> None:
    proc = subprocess.run([sys.executable, "-m", "ferry_broker", "--flush-mode", "maybe"],
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2 and "flush_mode" in proc.stderr


async def test_http_endpoints(broker: Broker) -> None:
    assert broker.get_json("/healthz") == {"status": "ok"}
    assert broker.get_json("/readyz") == {"status": "ready"}
    doc = broker.get_json("/openapi.json")
    assert doc["openapi"].startswith("3.") and "/v1/stats" in doc["paths"]
    c = await broker.client()
    await c.send("stats", 1, [message(b"x")] * 3)
    await c.close()
    stats = broker.get_json("/v1/stats")
    assert stats["topics"]["stats"]["1"] == {"min_offset": 0, "max_offset": 3}
    assert stats["broker"]["name"] == "broker-a"


async def test_sigterm_answers_parked_pulls_and_exits_cleanly(tmp_path: Path,
                                                              etcd: Etcd) -> None:
    b = start_broker(tmp_path, etcd)
    c = await b.client()
    await c.send("stop", 0, [message(b"before")])
    pull = asyncio.create_task(c.pull("stop", 0, 1, max_wait_ms=15_000))
    await asyncio.sleep(0.3)
    started = time.monotonic()
    b.proc.popen.terminate()
    fields, msgs = await asyncio.wait_for(pull, 5)  # answered, not dropped
    assert msgs == [] and fields["status"] == "OFFSET_OVERFLOW_ONE"
    assert time.monotonic() - started < 5
    await asyncio.to_thread(b.proc.popen.wait, 10)
    await c.close()
    assert b.proc.popen.returncode == 0
    log = b.proc.log()
    assert "broker stopped" in log and "Traceback" not in log
    with pytest.raises(OSError):
        urllib.request.urlopen(b.http + "/healthz", timeout=1)
