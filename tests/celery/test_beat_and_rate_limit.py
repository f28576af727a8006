"""`celery beat` and `rate_limit` on `ferry://`, with real beat and worker processes.

Both live in Celery itself (beat sends tasks on a schedule, the worker's token
bucket holds rate-limited tasks back); what the transport must do is carry
beat's sends and let the worker hold messages it took without acking them.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from tests.celery.app import make_app
from tests.celery.conftest import CeleryMesh, notes_db, proc_env, query, start_worker, wait_for
from tests.client.conftest import unique
from tests.support.procs import Proc, spawn

pytestmark = pytest.mark.integration

BEAT_EVERY_S = 1.0
BEAT_RUNS = 4
LIMITED = 30
RATE_PER_S = 10   # tests.celery.app.limited's rate_limit


def test_beat_sends_a_periodic_task_that_runs_again_and_again(
        celery_mesh: CeleryMesh, tmp_path: Path, procs: list[Proc]) -> None:
    queue = unique("beat")
    db = notes_db(tmp_path / "notes.db")
    conf = {"beat_schedule": {"tick": {"task": "tests.celery.app.stamp",
                                       "schedule": BEAT_EVERY_S, "args": ["tick"]}}}
    env = proc_env(celery_mesh, queue, db, FERRY_CELERY_TEST_CONF=json.dumps(conf))
    procs.append(start_worker(celery_mesh, "bw", env))
    beat = spawn("beat", [sys.executable, "-m", "celery", "-A", "tests.celery.app", "beat",
                          "-s", str(tmp_path / "beat-schedule"), "--max-interval", "1",
                          "-l", "info"], celery_mesh.workdir / "beat", env)
    procs.append(beat)
    wait_for(lambda: len(query(db, "SELECT 1 FROM notes WHERE phase = 'run'")) >= BEAT_RUNS
             or not beat.alive(), 60, f"{BEAT_RUNS} runs of the periodic task")
    assert beat.alive(), beat.log()[-3000:]
    ticks = [ts for (ts,) in query(db, "SELECT ts FROM notes WHERE phase = 'run' ORDER BY ts")]
    # One run per period, not a burst: after the first two (beat's start-up tick can
    # follow the first run closely on a loaded machine), runs spaced about BEAT_EVERY_S
    # apart (loosely).
    later = ticks[1:]
    assert all(b - a > BEAT_EVERY_S / 2 for a, b in zip(later, later[1:], strict=False)), ticks


def test_a_rate_limited_task_runs_no_faster_than_its_rate(
        celery_mesh: CeleryMesh, tmp_path: Path, procs: list[Proc]) -> None:
    queue = unique("rate")
    db = notes_db(tmp_path / "notes.db")
    procs.append(start_worker(celery_mesh, "rw", proc_env(celery_mesh, queue, db),
                              concurrency=4))
    app = make_app(celery_mesh.namesrv, queue)
    try:
        for n in range(LIMITED):
            app.send_task("tests.celery.app.limited", args=(f"r{n}",))
    finally:
        app.close()
    wait_for(lambda: len(query(db, "SELECT 1 FROM notes WHERE phase = 'run'")) == LIMITED, 60,
             "every rate-limited task ran")
    time.sleep(0.5)
    starts = [ts for (ts,) in query(db, "SELECT ts FROM notes WHERE phase = 'run' ORDER BY ts")]
    assert len(starts) == LIMITED   # each once
    # The worker releases one task per 1/RATE s; a loaded machine may start a few released
    # ones together in the pool, so: the whole run keeps the rate (a quarter of slack), and
    # no second holds more than a few over it. Without the limit all 30 start within a second.
    span = starts[-1] - starts[0]
    assert (LIMITED - 1) / span <= RATE_PER_S * 1.25, span
    busiest = max(sum(1 for t in starts if s <= t < s + 1.0) for s in starts)
    assert busiest <= RATE_PER_S + 3, busiest
