"""Fixtures for Celery on Ferry: a mesh with the delay scheduler, and real worker processes.

One mesh (namesrv, one broker with a 6 s consumer expiry, the delay
scheduler) serves the whole package; each test uses queues (topics) and
groups of its own. Workers are `python -m celery -A tests.celery.app worker`
processes, each in its own session so a kill -9 takes its pool children too.
"""
from __future__ import annotations

import asyncio
import os
import re
import signal
import sqlite3
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from ferry.client import Admin

from tests.client.conftest import FAST_EXPIRY_ENV, Mesh, start_mesh
from tests.support.procs import Etcd, Proc, spawn

sched = pytest.importorskip("tests.delay_scheduler.conftest")
pytest.importorskip("celery")

REPO = Path(__file__).resolve().parents[2]
READY_TIMEOUT_S = 60.0


@dataclass
class CeleryMesh:
    mesh: Mesh
    scheduler: Any
    workdir: Path

    @property
    def namesrv(self) -> str:
        return self.mesh.namesrv


@pytest.fixture(scope="package")
def celery_mesh(etcd: Etcd, tmp_path_factory: pytest.TempPathFactory) -> Iterator[CeleryMesh]:
    workdir = tmp_path_factory.mktemp("celery-mesh")
    mesh = start_mesh(etcd, workdir / "mesh", ("broker-a",), broker_env=FAST_EXPIRY_ENV)
    try:
        scheduler = sched.start_scheduler(mesh, "sched-celery")
    except BaseException:
        mesh.stop()
        raise
    yield CeleryMesh(mesh, scheduler, workdir)
    scheduler.proc.stop()
    mesh.stop()


def proc_env(cm: CeleryMesh, queue: str, db: Path, **extra: str) -> dict[str, str]:
    """The environment of a worker / bridge process of one test."""
    path = os.environ.get("PYTHONPATH", "")
    return {"FERRY_CELERY_TEST_NAMESRV": cm.namesrv, "FERRY_CELERY_TEST_QUEUE": queue,
            "FERRY_CELERY_TEST_DB": str(db), "FERRY_NAMESRV": cm.namesrv,
            "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), path) if p), **extra}


#: The worker options of most tests: no event heartbeats (test_remote sends events: `-E`).
QUIET_WORKER = ("--without-mingle", "--without-gossip", "--without-heartbeat")


def start_worker(cm: CeleryMesh, name: str, env: dict[str, str], *, pool: str = "prefork",
                 concurrency: int = 2, options: tuple[str, ...] = QUIET_WORKER) -> Proc:
    """A Celery worker process named `name`; returns once it says it is ready."""
    argv = [sys.executable, "-m", "celery", "-A", "tests.celery.app", "worker",
            f"--pool={pool}", "-c", str(concurrency), "--hostname", f"{name}@test",
            "-l", "info", *options]
    proc = spawn(name, argv, cm.workdir / name, env)
    wait_for(lambda: " ready." in proc.log() or not proc.alive(), READY_TIMEOUT_S,
             f"worker {name} ready")
    if not proc.alive():
        raise RuntimeError(f"worker {name} died:\n{proc.log()[-3000:]}")
    return proc


def kill9(proc: Proc) -> None:
    """SIGKILL the process and its whole session (a prefork worker's children too)."""
    try:
        os.killpg(proc.popen.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.popen.wait(timeout=10)


def notes_db(path: Path) -> Path:
    conn = sqlite3.connect(path)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        from tests.celery.app import NOTES_SCHEMA
        conn.execute(NOTES_SCHEMA)
        conn.commit()
    finally:
        conn.close()
    return path


def query(path: Path, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(path, timeout=60)
    try:
        return list(conn.execute(sql, params))
    finally:
        conn.close()


def wait_for(check: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout_s} s")
        time.sleep(0.1)


#: Topics a caller's reply queue, a worker's pidbox queue or an event receiver's queue
#: would leave (`<oid>.reply.celery.pidbox`, `wr1@test.celery.pidbox`, `celeryev.<uuid>`
#: through ferry.celery.naming.topic_for_queue); the exchanges' own topics (`fanout_…`) stay.
PER_CALLER_TOPIC = re.compile(r"(_reply_celery_pidbox|^(?!fanout_).*_celery_pidbox-[0-9a-f]{8}$"
                              r"|^celeryev_)")


def per_caller_topics(namesrv: str) -> set[str]:
    async def names() -> list[str]:
        async with Admin(namesrv=namesrv) as admin:
            return [t["name"] for t in await admin.list_topics()]
    return {n for n in asyncio.run(names()) if PER_CALLER_TOPIC.search(n)}


def none_left(namesrv: str, timeout_s: float = 15, before: frozenset[str] = frozenset()) -> None:
    """No per-caller topic (but those in `before`) is left, within `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while left := per_caller_topics(namesrv) - before:
        assert time.monotonic() < deadline, f"topics left behind: {sorted(left)}"
        time.sleep(0.2)


@pytest.fixture
def procs() -> Iterator[list[Proc]]:
    """Processes a test starts (bridges, workers); each is killed when the test ends.

    Killed, not stopped: the test has checked what it checks by then (a test that
    needs a clean stop, such as test_tracing's span flush, stops its processes
    itself), and a Celery prefork worker's warm shutdown takes 5-7 s of its own
    (the synloop's 2 s drain timeout, then billiard joining its pool threads).
    Each test uses queues and groups of its own, so a member left registered at
    the broker until it expires is in no other test's way.
    """
    started: list[Proc] = []
    yield started
    for proc in started:
        if proc.alive():   # one the test killed or stopped is gone already
            kill9(proc)
