"""What a newcomer does first: `make up`, then create, send and consume with `ferry`.

This runs deploy/local_mesh.py — the very script `make up` runs — on free
ports in a temporary directory, then the `ferry` command as a user types it,
then stops the mesh the way `make down` does and checks it stopped cleanly
(one mesh for the module's tests).
"""
from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.procs import free_port

ROOT = Path(__file__).resolve().parents[2]
FERRY = str(Path(sys.executable).parent / "ferry")
pytestmark = pytest.mark.integration


# One `make up` for the module: the tests use topics (and groups) of their own, and
# each start is nine processes; the stop at the end is checked as `make down` would.
@pytest.fixture(scope="module")
def mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    tmp_path = tmp_path_factory.mktemp("newcomer")
    names = ["ETCD", "ETCD_PEER", "REDIS", "NAMESRV", "BROKER_A", "BROKER_A_HTTP",
             "BROKER_B", "BROKER_B_HTTP", "SCHEDULER", "TXN_CHECKER", "DEDUP", "CONSOLE",
             "PROMETHEUS"]
    # Brokers take FERRY_BROKER_* from the environment; small preallocated segments.
    env = {**os.environ, "FERRY_MESH_VAR_DIR": str(tmp_path / "var"),
           "FERRY_BROKER_SEGMENT_BYTES": str(64 << 20)}
    env.update({f"FERRY_MESH_{n}_PORT": str(free_port()) for n in names})
    log = open(tmp_path / "mesh.out", "wb")  # noqa: SIM115
    # `make up PROMETHEUS=1`: its Prometheus too (tests/e2e/test_mesh_metrics.py)
    proc = subprocess.Popen([sys.executable, str(ROOT / "deploy" / "local_mesh.py"), "up",
                             "--prometheus"],
                            stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    out = tmp_path / "mesh.out"
    deadline = time.monotonic() + 60
    while b"Ferry is up" not in out.read_bytes():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            proc.wait()
            log.close()   # not left for the garbage collector to warn about in a later test
            pytest.fail(f"the mesh did not come up:\n{out.read_text()}")
        time.sleep(0.2)
    env["FERRY_NAMESRV"] = f"127.0.0.1:{env['FERRY_MESH_NAMESRV_PORT']}"
    env["FERRY_DELAY_SCHEDULER"] = f"127.0.0.1:{env['FERRY_MESH_SCHEDULER_PORT']}"
    env["FERRY_TXN_CHECKER"] = f"127.0.0.1:{env['FERRY_MESH_TXN_CHECKER_PORT']}"
    env["FERRY_DEDUP"] = f"127.0.0.1:{env['FERRY_MESH_DEDUP_PORT']}"
    try:
        yield env
    finally:
        proc.send_signal(signal.SIGTERM)  # what `make down` sends
        try:
            assert proc.wait(timeout=30) == 0, out.read_text()
        finally:
            if proc.poll() is None:
                proc.kill()
            log.close()
    text = out.read_text()
    for name in ("etcd", "redis", "namesrv", "broker-a", "broker-b", "scheduler",
                 "txn-checker", "dedup", "console", "prometheus"):
        assert f"{name:<10} stopped" in text


def ferry(env: dict[str, str], *args: str) -> str:
    done = subprocess.run([FERRY, *args], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, f"ferry {' '.join(args)}: {done.stdout}{done.stderr}"
    return done.stdout


def test_make_up_then_create_send_consume(mesh: dict[str, str]) -> None:
    ferry(mesh, "topic", "create", "demo")
    assert "demo" in ferry(mesh, "topic", "list")
    ferry(mesh, "send", "demo", "hello")
    out = ferry(mesh, "consume", "demo", "--group", "g", "--from", "earliest", "--count", "1",
                "--timeout-ms", "20000")
    assert "hello" in out
    # Brokers add a new topic to their registration a moment after it is created
    # (debounced), so the route may name one broker first, then both.
    deadline = time.monotonic() + 15
    routes = ferry(mesh, "topic", "describe", "demo")
    while not ("broker-a" in routes and "broker-b" in routes) and time.monotonic() < deadline:
        time.sleep(0.5)
        routes = ferry(mesh, "topic", "describe", "demo")
    assert "broker-a" in routes and "broker-b" in routes, routes
    # The mesh's dedup service (SQLite ledger) reconciles the topic: nothing was recorded
    # in the ledger for group g, so the message is missing (grace 0).
    report = json.loads(ferry(mesh, "dedup", "reconcile", "--topic", "demo", "--group", "g",
                              "--since", "10m", "--grace-ms", "0"))
    assert report["counts"]["stored"] == 1 and report["counts"]["missing"] == 1, report


def test_a_delayed_send_arrives_about_five_seconds_later(mesh: dict[str, str]) -> None:
    ferry(mesh, "topic", "create", "later-demo")
    sent = time.time()
    ferry(mesh, "send", "later-demo", "later", "--delay-ms", "5000")
    out = ferry(mesh, "consume", "later-demo", "--group", "g-later", "--from", "earliest",
                "--count", "1", "--timeout-ms", "30000")
    arrived = time.time()
    assert "later" in out
    assert 5.0 <= arrived - sent < 20.0  # never early; the consumer start-up adds its own time


def test_a_sql_subscription_takes_only_the_matching_message(mesh: dict[str, str]) -> None:
    ferry(mesh, "topic", "create", "filter-demo")
    ferry(mesh, "send", "filter-demo", "hello")
    ferry(mesh, "send", "filter-demo", "small", "--prop", "amount=5")
    ferry(mesh, "send", "filter-demo", "big", "--prop", "amount=500")
    out = ferry(mesh, "consume", "filter-demo", "--group", "g2", "--from", "earliest",
                "--count", "1", "--timeout-ms", "20000", "--sql", "amount > 100")
    assert "big" in out
    assert "hello" not in out and "small" not in out


async def test_make_up_writes_every_services_spans_under_var_traces(
        mesh: dict[str, str]) -> None:
    """A forced trace of a delayed message: the broker's and the scheduler's hops are in
    var/traces as JSON lines (docs/tracing.md, Service hops)."""
    from ferry.client import Producer
    from ferry.telemetry import read_trace_dir

    traces = Path(mesh["FERRY_MESH_VAR_DIR"]) / "traces"
    async with Producer(namesrv=mesh["FERRY_NAMESRV"]) as producer:
        sent = await producer.send_and_wait("trace-demo", b"traced", delay_ms=500, trace=True)
    want = {("ferry-broker", "store"), ("ferry-delay-scheduler", "schedule"),
            ("ferry-delay-scheduler", "deliver")}
    seen: set[tuple[str, str]] = set()
    deadline = time.monotonic() + 30
    while not want <= seen and time.monotonic() < deadline:
        await asyncio.sleep(0.5)
        seen = {(s["service"], s["attributes"].get("ferry.hop")) for s in read_trace_dir(traces)
                if s["attributes"].get("messaging.message.id") == sent.msg_id}
    assert want <= seen, seen
