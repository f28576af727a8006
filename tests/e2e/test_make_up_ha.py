"""`make up HA=1`: two brokers per broker name, the banner says which is master.

Runs deploy/local_mesh.py up --ha (what `make up HA=1` runs) on free ports in a
temporary directory, checks the banner names one master and one slave per
broker name, sends and consumes with `ferry`, then stops it as `make down`
does.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.e2e.test_newcomer import ferry
from tests.support.procs import free_port

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.integration, pytest.mark.slow]

PORTS = ["ETCD", "ETCD_PEER", "REDIS", "NAMESRV", "SCHEDULER", "TXN_CHECKER", "DEDUP", "CONSOLE",
         *(f"BROKER_{g}{i}{kind}" for g in "AB" for i in ("", "1")
           for kind in ("", "_REPL", "_HTTP"))]


def test_make_up_ha_runs_a_master_and_a_slave_per_broker_name(tmp_path: Path) -> None:
    env = {**os.environ, "FERRY_MESH_VAR_DIR": str(tmp_path / "var"),
           "FERRY_BROKER_SEGMENT_BYTES": str(64 << 20)}
    env.update({f"FERRY_MESH_{n}_PORT": str(free_port()) for n in PORTS})
    out = tmp_path / "mesh.out"
    with open(out, "wb") as log:
        proc = subprocess.Popen([sys.executable, str(ROOT / "deploy" / "local_mesh.py"), "up",
                                 "--ha"], stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    try:
        deadline = time.monotonic() + 90
        while b"Ferry is up" not in out.read_bytes():
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the HA mesh did not come up:\n{out.read_text()}")
            time.sleep(0.2)
        text = out.read_text()
        roles = dict(re.findall(r"(broker-[ab]-[01]) 127\.0\.0\.1:\d+ .*: (\w+)", text))
        assert sorted(roles) == ["broker-a-0", "broker-a-1", "broker-b-0", "broker-b-1"], text
        for group in ("broker-a", "broker-b"):
            assert sorted(roles[f"{group}-{i}"] for i in (0, 1)) == ["master", "slave"], text
        assert "sync replication" in text
        env["FERRY_NAMESRV"] = f"127.0.0.1:{env['FERRY_MESH_NAMESRV_PORT']}"
        ferry(env, "topic", "create", "demo")
        ferry(env, "send", "demo", "hello")
        got = ferry(env, "consume", "demo", "--group", "g", "--from", "earliest", "--count", "1",
                    "--timeout-ms", "20000")
        assert "hello" in got
    finally:
        proc.send_signal(signal.SIGTERM)   # what `make down` sends
        try:
            assert proc.wait(timeout=60) == 0, out.read_text()
        finally:
            if proc.poll() is None:
                proc.kill()
    for name in ("broker-a-0", "broker-a-1", "broker-b-0", "broker-b-1"):
        assert f"{name:<10} stopped" in out.read_text()
