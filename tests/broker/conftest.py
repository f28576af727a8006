"""Broker test fixtures: the broker as a real process on free ports, with real etcd."""
from __future__ import annotations

import itertools
import json
import os
import sys
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.broker.wire_client import WireClient
from tests.support.procs import Etcd, Proc, free_port, spawn, wait_until_ready

_prefixes = itertools.count(1)


@dataclass
class Broker:
    """A running `python -m ferry_broker` and how to reach it."""

    proc: Proc
    port: int
    http_port: int
    data_dir: Path
    env: dict[str, str] = field(default_factory=dict)

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def get_json(self, path: str) -> Any:
        with urllib.request.urlopen(self.http + path, timeout=5) as resp:
            return json.loads(resp.read())

    async def client(self) -> WireClient:
        return await WireClient.connect("127.0.0.1", self.port)


def unique_prefix() -> str:
    return f"/ferry-broker-test-{os.getpid()}-{next(_prefixes)}/"


def start_broker(workdir: Path, etcd: Etcd | None, data_dir: Path | None = None,
                 prefix: str | None = None, **env: str) -> Broker:
    port, http_port = free_port(), free_port()
    data_dir = data_dir or workdir / "data"
    full = {
        "FERRY_BROKER_PORT": str(port), "FERRY_BROKER_HTTP_PORT": str(http_port),
        "FERRY_BROKER_DATA_DIR": str(data_dir),
        "FERRY_BROKER_ETCD": etcd.endpoint if etcd else "",
        "FERRY_BROKER_ETCD_PREFIX": prefix or unique_prefix(),
        "FERRY_BROKER_SEGMENT_BYTES": str(64 << 20),
        "FERRY_BROKER_LOG_LEVEL": "INFO",
    }
    full.update(env)
    proc = spawn("broker", [sys.executable, "-m", "ferry_broker"], workdir, env=full)
    broker = Broker(proc, port, http_port, data_dir, full)
    wait_ready(broker)
    return broker


def wait_ready(broker: Broker, timeout_s: float = 20.0) -> None:
    wait_until_ready(broker.proc, broker.http + "/readyz", timeout_s)


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory, etcd: Etcd) -> Iterator[Broker]:
    """One broker shared by a test module (tests use distinct topics)."""
    b = start_broker(tmp_path_factory.mktemp("broker"), etcd)
    yield b
    b.proc.stop()
    print(b.proc.log()[-5000:])  # shown by pytest when a test of the module failed


@pytest.fixture
async def client(broker: Broker) -> AsyncIterator[WireClient]:
    c = await broker.client()
    yield c
    await c.close()
