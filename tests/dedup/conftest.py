"""Fixtures for ferry-dedup: the service as a real process over a real mesh, Redis and ledger.

`start_dedup(mesh, redis_url, workdir, ...)` runs `python -m ferry_dedup` on a
free HTTP port (SQLite ledger under its data dir unless `ledger_url` is given)
and waits for /readyz. `DedupProc.call` speaks JSON to it with the standard
library, as a non-Python client would. The PostgreSQL fixtures of
tests/idempotence are shared from there.
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
from tests.idempotence.conftest import pg_database, postgres  # noqa: F401 - shared fixtures
from tests.support.procs import Etcd, Proc, free_port, spawn, wait_until_ready

READY_TIMEOUT_S = 30.0


@dataclass
class DedupProc:
    """One dedup process and its HTTP API."""

    proc: Proc
    http_port: int
    data_dir: Path

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    def call(self, method: str, path: str, body: Any = None,
             raw: bytes | None = None) -> tuple[int, Any]:
        """(status, JSON body) of one request; `raw` sends bytes as they are."""
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        req = urllib.request.Request(f"http://{self.addr}{path}", data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())

    def ok(self, method: str, path: str, body: Any = None) -> Any:
        status, data = self.call(method, path, body)
        assert status == 200, (status, data)
        return data


def start_dedup(mesh: Mesh, redis_url: str, workdir: Path, *, ledger_url: str | None = None,
                env: dict[str, str] | None = None) -> DedupProc:
    port = free_port()
    data_dir = workdir / "data"
    full_env = {"FERRY_DEDUP_HOST": "127.0.0.1", "FERRY_DEDUP_HTTP_PORT": str(port),
                "FERRY_DEDUP_DATA_DIR": str(data_dir), "FERRY_DEDUP_NAMESRV": mesh.namesrv,
                "FERRY_DEDUP_REDIS": redis_url, **(env or {})}
    if ledger_url is not None:
        full_env["FERRY_DEDUP_LEDGER_URL"] = ledger_url
    proc = spawn("dedup", [sys.executable, "-m", "ferry_dedup"], workdir, full_env)
    wait_until_ready(proc, f"http://127.0.0.1:{port}/readyz", READY_TIMEOUT_S)
    return DedupProc(proc, port, data_dir)


def wait_for(check: Callable[[], Any], timeout_s: float = 30.0, what: str = "condition") -> Any:
    """Poll `check` until it returns something true; that value."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not met within {timeout_s}s")
        time.sleep(0.1)


@pytest.fixture(scope="module")
def mesh(etcd: Etcd, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mesh]:
    """Two brokers: reconciliation reads every queue of the route, on every broker."""
    m = start_mesh(etcd, tmp_path_factory.mktemp("mesh"))
    yield m
    m.stop()
