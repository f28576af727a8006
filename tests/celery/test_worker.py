"""Celery workers on `ferry://`: real worker processes against a real mesh.

- 2,000 tasks, one of two prefork workers killed with -9 mid-run: every task
  ran, and every task the killed worker had taken but not finished (its
  unacked tasks) ran on the other worker;
- `countdown=3` runs no earlier than 3 s after apply; a task's
  `self.retry(countdown=1)` comes back no earlier than 1 s later.
"""
from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from tests.celery.app import make_app
from tests.celery.conftest import (
    CeleryMesh,
    kill9,
    notes_db,
    proc_env,
    query,
    start_worker,
    wait_for,
)
from tests.client.conftest import unique
from tests.support.procs import Proc

pytestmark = pytest.mark.integration

TASKS = 2_000
#: Each task's work: long enough that the kill lands while tasks are running.
TASK_SLEEP_S = 0.01


def done_ids(db: Path, host: str | None = None) -> set[str]:
    sql = "SELECT task_id FROM notes WHERE phase = 'done'"
    rows = query(db, sql + " AND host = ?", host) if host else query(db, sql)
    return {r[0] for r in rows}


@pytest.mark.slow
def test_worker_killed_mid_run_loses_no_task(celery_mesh: CeleryMesh, tmp_path: Path,
                                            procs: list[Proc]) -> None:
    queue = unique("tasks")
    db = notes_db(tmp_path / "notes.db")
    env = proc_env(celery_mesh, queue, db)
    procs.append(start_worker(celery_mesh, "wa", env))
    procs.append(start_worker(celery_mesh, "wb", env))
    app = make_app(celery_mesh.namesrv, queue)
    ids: list[str] = []

    def publish() -> None:
        for n in range(TASKS):
            ids.append(app.send_task("tests.celery.app.record", args=(n, TASK_SLEEP_S)).id)
    publisher = threading.Thread(target=publish)
    publisher.start()
    wait_for(lambda: len(done_ids(db, "wa@test")) >= 200, 90, "worker A ran 200 tasks")
    kill9(procs[0])
    publisher.join(60)
    app.close()
    assert len(ids) == TASKS
    wait_for(lambda: len(done_ids(db)) >= TASKS, 120, "every task done")
    assert done_ids(db) == set(ids)
    taken_by_a = {r[0] for r in query(
        db, "SELECT task_id FROM notes WHERE phase = 'received' AND host = 'wa@test'")}
    unfinished_on_a = taken_by_a - done_ids(db, "wa@test")
    assert unfinished_on_a, "the kill should catch worker A with tasks taken but not done"
    assert unfinished_on_a <= done_ids(db, "wb@test")


def test_countdown_and_retry_ride_on_delayed_messages(celery_mesh: CeleryMesh, tmp_path: Path,
                                                      procs: list[Proc]) -> None:
    queue = unique("timed")
    db = notes_db(tmp_path / "notes.db")
    # prefork: the retry is sent from a pool child, on a connection made after the fork
    procs.append(start_worker(celery_mesh, "wt", proc_env(celery_mesh, queue, db)))
    app = make_app(celery_mesh.namesrv, queue)
    applied = time.time()
    app.send_task("tests.celery.app.stamp", args=("later",), countdown=3)
    app.send_task("tests.celery.app.stamp", args=("now",))
    app.send_task("tests.celery.app.flaky", args=("f",))
    app.close()
    wait_for(lambda: len(query(db, "SELECT 1 FROM notes WHERE phase = 'run'")) == 2, 60,
             "both stamps ran")
    runs = dict(query(db, "SELECT label, ts FROM notes WHERE phase = 'run'"))
    assert runs["later"] >= applied + 3.0   # never early
    assert runs["now"] < runs["later"]
    wait_for(lambda: len(query(db, "SELECT 1 FROM notes WHERE phase = 'attempt'")) == 2, 60,
             "the retry ran")
    attempts = query(db, "SELECT retries, ts FROM notes WHERE phase = 'attempt' ORDER BY ts")
    assert [r for r, _ in attempts] == [0, 1]
    assert attempts[1][1] >= attempts[0][1] + 1.0
