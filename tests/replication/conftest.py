"""Fixtures of the replication fault tests: replicated broker groups as real processes.

`clusters(replication=..., ...)` starts a namesrv and a group `broker-a` of a
master and a slave (see tests.support.ha) over the session's etcd, and stops
every process it started when the test ends, printing their logs' tails (shown
by pytest when the test failed).
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.ha import Cluster, start_cluster
from tests.support.procs import Etcd


@pytest.fixture
def clusters(etcd: Etcd, tmp_path: Path) -> Iterator[Callable[..., Cluster]]:
    started: list[Cluster] = []

    def make(**kw: Any) -> Cluster:
        cluster = start_cluster(etcd, tmp_path / f"c{len(started)}", **kw)
        started.append(cluster)
        return cluster

    yield make
    for cluster in started:
        cluster.stop()
        print(cluster.logs())
