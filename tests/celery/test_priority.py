"""kombu message priority on `ferry://`: a queue declared with a max priority (Celery's
`task_queue_max_priority`) is a topic with Ferry's priority levels, and a task's
`priority` (0..9, 9 first) picks the level; in a backlog the high ones run first
(real worker, real mesh)."""
from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from ferry.client import Admin

from tests.celery.app import make_app
from tests.celery.conftest import CeleryMesh, notes_db, proc_env, query, start_worker, wait_for
from tests.client.conftest import unique
from tests.support.procs import Proc

pytestmark = pytest.mark.integration

LOW, HIGH = 32, 6
#: High tasks may follow this many low ones: what the worker took before the high
#: level's first pull answered (one in the pool, one prefetched, one in the window).
HEAD_START = 4
CONF = {"task_queue_max_priority": 9, "worker_prefetch_multiplier": 1}


async def _levels(namesrv: str, topic: str) -> int:
    async with Admin(namesrv=namesrv) as admin:
        return int((await admin.describe_topic(topic))["priority_levels"])


def test_high_priority_tasks_in_a_backlog_run_first(
        celery_mesh: CeleryMesh, tmp_path: Path, procs: list[Proc]) -> None:
    queue = unique("prio")
    db = notes_db(tmp_path / "notes.db")
    app = make_app(celery_mesh.namesrv, queue, **CONF)
    try:
        for n in range(LOW):
            app.send_task("tests.celery.app.stamp", args=(f"low{n}",), priority=0)
        for n in range(HIGH):
            app.send_task("tests.celery.app.stamp", args=(f"high{n}",), priority=9)
    finally:
        app.close()
    assert asyncio.run(_levels(celery_mesh.namesrv, queue)) == 4
    env = proc_env(celery_mesh, queue, db, FERRY_CELERY_TEST_WINDOW="1",
                   FERRY_CELERY_TEST_CONF=json.dumps(CONF))
    procs.append(start_worker(celery_mesh, "prio", env, pool="solo", concurrency=1))
    wait_for(lambda: len(query(db, "SELECT 1 FROM notes WHERE phase = 'run'")) == LOW + HIGH,
             60, "every task ran")
    order = [label for (label,) in query(db, "SELECT label FROM notes WHERE phase = 'run' "
                                             "ORDER BY rowid")]
    last_high = max(i for i, label in enumerate(order) if label.startswith("high"))
    assert last_high < HIGH + HEAD_START, order
