"""Session fixtures: a real etcd and a real Redis on free ports.

Each is started once per test session in a temporary directory and stopped at
the end. Tests that need isolation use their own key prefix (etcd) or
database number / key prefix (Redis), or start their own with the helpers in
`tests.support.procs`.
"""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.procs import Etcd, Redis, start_etcd, start_redis


@pytest.fixture(scope="session")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Etcd]:
    server = start_etcd(Path(tmp_path_factory.mktemp("etcd")))
    yield server
    server.proc.stop()


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Redis]:
    server = start_redis(Path(tmp_path_factory.mktemp("redis")))
    yield server
    server.proc.stop()


@pytest.fixture(autouse=True)
def _fresh_tracing() -> Iterator[None]:
    """Each test starts with the process's tracing not set up.

    The first client started in a process sets tracing up for the whole
    process (service name, exporters, trace-topic target); without this, what
    one test set up (or named) would leak into the next.
    """
    from ferry.telemetry import reset_tracing, tracing
    if tracing().service:
        reset_tracing()
    yield
