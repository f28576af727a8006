"""`purge` on `ferry://` (kombu's `queue_purge`, `app.control.purge()`, `celery purge`):
the queue's group moves past what is stored, so nothing sent before the purge runs,
and what is sent after it does (real worker, real mesh)."""
from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.celery.app import make_app
from tests.celery.conftest import CeleryMesh, notes_db, proc_env, query, start_worker, wait_for
from tests.client.conftest import unique
from tests.support.procs import Proc

pytestmark = pytest.mark.integration

OLD, NEW = 6, 3


def test_purge_skips_what_is_stored_and_new_tasks_run(
        celery_mesh: CeleryMesh, tmp_path: Path, procs: list[Proc]) -> None:
    queue = unique("purge")
    db = notes_db(tmp_path / "notes.db")
    app = make_app(celery_mesh.namesrv, queue)
    try:
        for n in range(OLD):
            app.send_task("tests.celery.app.stamp", args=(f"old{n}",))
        assert app.control.purge() == OLD
        assert app.control.purge() == 0   # nothing left to skip
        procs.append(start_worker(celery_mesh, "pw", proc_env(celery_mesh, queue, db)))
        for n in range(NEW):
            app.send_task("tests.celery.app.stamp", args=(f"new{n}",))
        wait_for(lambda: len(query(db, "SELECT 1 FROM notes WHERE phase = 'run'")) >= NEW, 60,
                 "the tasks sent after the purge ran")
        time.sleep(2)   # an old task wrongly delivered would have run by now too
    finally:
        app.close()
    ran = sorted(label for (label,) in query(db, "SELECT label FROM notes WHERE phase = 'run'"))
    assert ran == [f"new{n}" for n in range(NEW)]
