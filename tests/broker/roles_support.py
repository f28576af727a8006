"""Helpers for the broker-group tests (test_roles*.py): members of one group on real processes."""
from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from ferry.auth.http import signed_url_headers

from tests.broker.auth_support import creds
from tests.broker.conftest import Broker, start_broker, unique_prefix
from tests.support.procs import Etcd, free_port

TTL_S = 2


def start_member(workdir: Path, etcd: Etcd, prefix: str, broker_id: int, mode: str = "async",
                 data_dir: Path | None = None, **extra: str) -> Broker:
    """A member of broker group broker-a: same name, its own id, store and ports."""
    env = {"FERRY_BROKER_ID": str(broker_id), "FERRY_BROKER_NAME": "broker-a",
           "FERRY_BROKER_REPLICATION": mode, "FERRY_BROKER_REPL_PORT": str(free_port()),
           "FERRY_BROKER_ELECTION_TTL_S": str(TTL_S), **extra}
    return start_broker(workdir, etcd, data_dir=data_dir or workdir / f"data-{broker_id}",
                        prefix=prefix, **env)


def replication(broker: Broker, access_key: str | None = None) -> dict[str, Any]:
    """The broker's replication status (with auth on: read as `access_key`, e.g. "root")."""
    if access_key is None:
        return broker.get_json("/v1/stats")["replication"]
    url = broker.http + "/v1/stats"
    req = urllib.request.Request(
        url, headers=signed_url_headers(creds(access_key), "GET", url))
    with urllib.request.urlopen(req, timeout=5) as resp:
        return json.loads(resp.read())["replication"]


def identity(access_key: str) -> dict[str, str]:
    """The environment of a broker with auth on that runs as `access_key`."""
    c = creds(access_key)
    return {"FERRY_AUTH": "on", "FERRY_BROKER_ACCESS_KEY": c.access_key,
            "FERRY_BROKER_SECRET_KEY": c.secret_key}


async def eventually(check: Callable[[], bool], timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if await asyncio.to_thread(check):
                return
        except OSError:
            pass  # a broker between lives
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.1)


def is_master(b: Broker) -> bool:
    r = replication(b)
    return r["role"] == "master" and r["writable"]


def follows(slave: Broker, master: Broker) -> bool:
    r = replication(slave)
    return (r["role"] == "slave" and r.get("follower", {}).get("connected", False)
            and r["epoch"] == replication(master)["epoch"])


@pytest.fixture
def prefix() -> str:
    return unique_prefix()


@pytest.fixture
def group(tmp_path: Path, etcd: Etcd, prefix: str) -> Iterator[Any]:
    started: list[Broker] = []

    def start(broker_id: int, **kw: Any) -> Broker:
        b = start_member(tmp_path, etcd, prefix, broker_id, **kw)
        started.append(b)
        return b

    yield start
    for b in started:
        b.proc.stop()
    for b in started:
        print(b.proc.log()[-4000:])


async def two_members(group: Any, **kw: Any) -> tuple[Broker, Broker]:
    """Start two members; return (master, slave) once the slave follows."""
    a, b = group(0, **kw), group(1, **kw)
    await eventually(lambda: is_master(a) or is_master(b))
    master, slave = (a, b) if is_master(a) else (b, a)
    await eventually(lambda: follows(slave, master))
    return master, slave


