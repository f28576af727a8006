"""The `ferry://` transport's visibility timeout, with real prefork workers on a real mesh.

Tasks that hang on their first run in one worker (acks late) are delivered
again after the visibility timeout and run on the other worker (the one that
serves the group's retry queue) while the first runs still hang; the group's
commit moves past them; the late runs change nothing.
"""
from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from ferry.client import Admin
from ferry.client.core.connection import ConnectionPool
from ferry.client.core.namesrv import NamesrvClient
from ferry.wire import RequestCode

from tests.celery.app import make_app
from tests.celery.conftest import CeleryMesh, notes_db, proc_env, query, start_worker, wait_for
from tests.client.conftest import unique
from tests.support.procs import Proc

pytestmark = pytest.mark.integration

VISIBILITY_S = 3
HANG_S = 600.0   # the first run outlives the test (its workers are killed at the end)
TASKS = 8        # the test topic's queue count (topic_queues): some land on each worker


async def _members(namesrv: str, group: str, topic: str) -> int:
    """How many members the broker of `topic` lists in `group`."""
    names = NamesrvClient(namesrv)
    await names.start()
    pool = ConnectionPool()
    try:
        route = await names.get_route(topic)
        resp = await pool.request(route.brokers[0].master, RequestCode.GET_CONSUMERS,
                                  {"group": group, "topic": topic})
        return len(resp.fields.get("members") or ())
    finally:
        await pool.close()
        await names.close()


async def _lag(namesrv: str, group: str, topic: str) -> int:
    async with Admin(namesrv=namesrv) as admin:
        return sum(q.lag for q in await admin.group_lag(group, [topic, f"%RETRY%{group}"]))


def test_a_task_hanging_past_the_visibility_timeout_runs_again_elsewhere(
        celery_mesh: CeleryMesh, tmp_path: Path, procs: list[Proc]) -> None:
    queue = unique("vis")
    group = f"celery-{queue}"
    db = notes_db(tmp_path / "notes.db")

    async def configure() -> None:   # a short back-off, through the delay scheduler
        async with Admin(namesrv=celery_mesh.namesrv) as admin:
            await admin.create_group(group, retry_backoff_ms=[500])
    asyncio.run(configure())
    env = proc_env(celery_mesh, queue, db, FERRY_CELERY_TEST_VISIBILITY_S=str(VISIBILITY_S))
    procs.append(start_worker(celery_mesh, "va", env))
    procs.append(start_worker(celery_mesh, "vb", env))
    # Both members in, and their rebalance settled (1 s rounds): a queue changing hands
    # meanwhile would deliver some tasks twice (at least once), which is not under test here.
    wait_for(lambda: asyncio.run(_members(celery_mesh.namesrv, group, queue)) == 2, 30,
             "both workers in the group")
    time.sleep(3)
    app = make_app(celery_mesh.namesrv, queue)
    try:
        # Which worker serves the group's retry queue (one per broker): a requeued probe
        # runs there. The tasks then hang on the other worker only.
        app.send_task("tests.celery.app.requeue_once", args=("probe",))
        wait_for(lambda: bool(query(db, "SELECT 1 FROM notes WHERE phase = 'requeued'")), 60,
                 "the requeued probe ran again")
        [(retry_host,)] = query(db, "SELECT host FROM notes WHERE phase = 'requeued'")
        other = "vb@test" if retry_host == "va@test" else "va@test"
        labels = [f"h{n}" for n in range(TASKS)]   # one per queue of the topic
        for label in labels:
            app.send_task("tests.celery.app.hang_once", args=(label, HANG_S, other))
        wait_for(lambda: len(_finished(db)) == TASKS, 60, "every task ran (again)")
        # The commit moves past the hung messages (acked by no one) once their copies are stored.
        wait_for(lambda: asyncio.run(_lag(celery_mesh.namesrv, group, queue)) == 0, 30,
                 "the group's commit passed every message, the hung ones included")
        time.sleep(VISIBILITY_S + 2)   # a second timeout (wrongly) would bring a third run
    finally:
        app.close()
    hung = query(db, "SELECT label, host FROM notes WHERE phase = 'hang'")
    assert hung and {host for _, host in hung} == {other}
    reruns = query(db, "SELECT label, host FROM notes WHERE phase = 'rerun'")
    # Each hung task ran again once, on the other worker, while the first run still hangs.
    assert (sorted(label.split(" pid=")[0] for label, _ in reruns)
            == sorted(label.split(" pid=")[0] for label, _ in hung))
    assert {host for _, host in reruns} == {retry_host}
    assert not query(db, "SELECT 1 FROM notes WHERE phase = 'done'")
    assert _finished(db) == set(labels)


def _finished(db: Path) -> set[str]:
    """Labels that ran to the end somewhere (`ran`, or `rerun` after a hang)."""
    rows = query(db, "SELECT label FROM notes WHERE phase IN ('ran', 'rerun')")
    return {label.split(" pid=")[0] for (label,) in rows}
