"""Integration fixtures: txn-checker processes over a real mesh (etcd, namesrv, brokers).

`start_txn_checker(mesh, name, ...)` runs `python -m ferry_txn_checker` on a
free HTTP port over a `tests.client.conftest.Mesh` (or restarts it on its old
data directory) and waits for /readyz. Short schedule settings are given
through `env` (FERRY_TXN_CHECKER_CHECK_IMMUNITY_MS, ..._CHECK_INTERVAL_MS,
..._MAX_CHECKS); `FAST_SCHEDULE` is a set for tests that want checks quickly.
"""
from __future__ import annotations

import json
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.client.conftest import Mesh, start_mesh
from tests.support.procs import Etcd, Proc, free_port, spawn, wait_until_ready

READY_TIMEOUT_S = 30.0
#: Checks a second after begin, then every second; 3 checks before a discard.
FAST_SCHEDULE = {"FERRY_TXN_CHECKER_CHECK_IMMUNITY_MS": "1000",
                 "FERRY_TXN_CHECKER_CHECK_INTERVAL_MS": "1000",
                 "FERRY_TXN_CHECKER_MAX_CHECKS": "3"}


@dataclass
class TxnCheckerProc:
    """One txn-checker process and its HTTP API."""

    name: str
    proc: Proc
    http_port: int
    data_dir: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    def get(self, path: str) -> tuple[int, dict[str, Any]]:
        try:
            with urllib.request.urlopen(self.url + path, timeout=10) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())

    def stats(self) -> dict[str, Any]:
        status, body = self.get("/v1/stats")
        assert status == 200, body
        return body


def start_txn_checker(mesh: Mesh, name: str = "txn-checker", *, http_port: int | None = None,
                      env: dict[str, str] | None = None) -> TxnCheckerProc:
    """Start (or restart, on its old data directory) txn-checker `name`; waits for /readyz."""
    port = http_port or free_port()
    workdir = mesh.workdir / name
    data_dir = workdir / "data"
    full_env = {
        "FERRY_TXN_CHECKER_HOST": "127.0.0.1", "FERRY_TXN_CHECKER_HTTP_PORT": str(port),
        "FERRY_TXN_CHECKER_DATA_DIR": str(data_dir),
        "FERRY_TXN_CHECKER_NAMESRV": mesh.namesrv,
        "FERRY_TXN_CHECKER_ETCD": mesh.etcd.endpoint,
        # The leader key under the mesh's own prefix: each test's checkers elect alone.
        "FERRY_TXN_CHECKER_ETCD_PREFIX": mesh.prefix,
        "FERRY_TXN_CHECKER_INSTANCE_ID": name,
        "FERRY_TXN_CHECKER_ROUTE_POLL_MS": "300",
        "FERRY_TXN_CHECKER_PULL_MAX_WAIT_MS": "300",
        "FERRY_TXN_CHECKER_RETRY_BACKOFF_MS": "300",
        "FERRY_TXN_CHECKER_CHECKPOINT_INTERVAL_MS": "200",
        **(env or {})}
    proc = spawn(name, [sys.executable, "-m", "ferry_txn_checker"], workdir, full_env)
    wait_until_ready(proc, f"http://127.0.0.1:{port}/readyz", READY_TIMEOUT_S)
    return TxnCheckerProc(name, proc, port, data_dir)


def wait_for(check: Callable[[], Any], timeout_s: float = 30.0, what: str = "condition") -> Any:
    """Poll `check` until it returns something true; that value."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not met within {timeout_s}s")
        time.sleep(0.05)


@pytest.fixture
def txn_mesh(etcd: Etcd, tmp_path: Path) -> Iterator[Mesh]:
    """A fresh one-broker mesh per test (tests kill processes)."""
    m = start_mesh(etcd, tmp_path / "mesh", ("broker-a",))
    yield m
    m.stop()
