"""Process fixtures for client integration tests: namesrv and brokers on free ports.

A `Mesh` is one namesrv plus brokers (real `python -m ferry_namesrv` /
`python -m ferry_broker` processes) over the session's etcd, under an etcd
prefix of its own so meshes never see each other. `mesh` is shared by a test
module (tests use topics and groups of their own); `fresh_mesh` is per test,
for tests that kill brokers. Reusable from other test packages by import.
"""
from __future__ import annotations

import json
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from ferry.auth.credentials import Credentials
from ferry.auth.http import signed_url_headers

from tests.support.procs import (
    Etcd,
    Proc,
    free_port,
    spawn,
    start_namesrv,
    wait_until_ready,
)

READY_TIMEOUT_S = 30.0


@dataclass
class BrokerProc:
    """One broker process and how to reach it."""

    name: str
    proc: Proc
    port: int
    http_port: int
    data_dir: Path

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.port}"


@dataclass
class Mesh:
    """namesrv + brokers over one etcd prefix."""

    etcd: Etcd
    workdir: Path
    prefix: str = field(default_factory=lambda: f"/ferry-test-{uuid.uuid4().hex[:8]}/")
    namesrv_proc: Proc | None = None
    namesrv_port: int = 0
    brokers: dict[str, BrokerProc] = field(default_factory=dict)
    broker_env: dict[str, str] = field(default_factory=dict)   # extra FERRY_BROKER_* settings
    namesrv_env: dict[str, str] = field(default_factory=dict)  # extra namesrv settings (FERRY_AUTH)
    #: What the test process signs its own namesrv calls with (a mesh with auth on).
    credentials: Credentials | None = None

    @property
    def namesrv(self) -> str:
        return f"127.0.0.1:{self.namesrv_port}"

    def start_namesrv(self) -> None:
        self.namesrv_proc, self.namesrv_port = start_namesrv(
            self.etcd.endpoint, self.prefix, self.workdir / "namesrv", self.namesrv_env,
            timeout_s=READY_TIMEOUT_S)

    def start_broker(self, name: str, *, port: int | None = None) -> BrokerProc:
        """Start (or restart, on its old port and data) broker `name`; waits until routed."""
        old = self.brokers.get(name)
        port = port or (old.port if old else free_port())
        http_port = old.http_port if old else free_port()
        data_dir = self.workdir / name / "data"
        env = {"FERRY_BROKER_CLUSTER": "TestCluster", "FERRY_BROKER_NAME": name,
               "FERRY_BROKER_ID": "0", "FERRY_BROKER_HOST": "127.0.0.1",
               "FERRY_BROKER_PORT": str(port), "FERRY_BROKER_HTTP_PORT": str(http_port),
               "FERRY_BROKER_DATA_DIR": str(data_dir), "FERRY_BROKER_ETCD": self.etcd.endpoint,
               "FERRY_BROKER_ETCD_PREFIX": self.prefix, "FERRY_BROKER_FLUSH_MODE": "async",
               "FERRY_BROKER_AUTO_CREATE_TOPICS": "true", "FERRY_BROKER_DEFAULT_QUEUES": "4",
               # Segments are preallocated: the 1 GiB default would take a GiB of disk
               # per broker per test.
               "FERRY_BROKER_SEGMENT_BYTES": str(64 << 20),
               **self.broker_env}
        proc = spawn(name, [sys.executable, "-m", "ferry_broker"], self.workdir / name, env)
        wait_until_ready(proc, f"http://127.0.0.1:{http_port}/readyz",
                         READY_TIMEOUT_S)
        broker = BrokerProc(name, proc, port, http_port, data_dir)
        self.brokers[name] = broker
        self.wait_brokers_listed()
        return broker

    def listed_brokers(self) -> set[str]:
        url = f"http://{self.namesrv}/v1/brokers"
        req = urllib.request.Request(url, headers=signed_url_headers(self.credentials, "GET", url))
        try:
            with urllib.request.urlopen(req, timeout=2) as resp:
                data = json.loads(resp.read())
        except (urllib.error.URLError, OSError, ValueError):
            return set()
        return {b["name"] for b in data.get("brokers", [])}

    def wait_brokers_listed(self, timeout_s: float = 20.0) -> None:
        """Until namesrv lists exactly the live brokers."""
        want = {n for n, b in self.brokers.items() if b.proc.alive()}
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.listed_brokers() == want:
                return
            time.sleep(0.1)
        raise RuntimeError(f"namesrv lists {self.listed_brokers()}, expected {want}")

    def stop(self) -> None:
        for b in self.brokers.values():
            b.proc.stop()
        if self.namesrv_proc is not None:
            self.namesrv_proc.stop()


def start_mesh(etcd: Etcd, workdir: Path, broker_names: tuple[str, ...] = ("broker-a", "broker-b"),
               broker_env: dict[str, str] | None = None) -> Mesh:
    mesh = Mesh(etcd, workdir, broker_env=dict(broker_env or {}))
    try:
        mesh.start_namesrv()
        for name in broker_names:
            mesh.start_broker(name)
    except BaseException:
        mesh.stop()
        raise
    return mesh


@pytest.fixture(scope="module")
def mesh(etcd: Etcd, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mesh]:
    m = start_mesh(etcd, tmp_path_factory.mktemp("mesh"))
    yield m
    m.stop()


# Crash tests wait for the broker to forget a dead consumer: 6 s instead of 30 s.
FAST_EXPIRY_ENV = {"FERRY_BROKER_CONSUMER_EXPIRY_MS": "6000"}


@pytest.fixture
def fresh_mesh(etcd: Etcd, tmp_path: Path) -> Iterator[Mesh]:
    m = start_mesh(etcd, tmp_path / "mesh", broker_env=FAST_EXPIRY_ENV)
    yield m
    m.stop()


def unique(prefix: str) -> str:
    """A topic or group name no other test uses."""
    return f"{prefix}-{uuid.uuid4().hex[:8]}"
