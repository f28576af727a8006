"""The `ferry://` transport's visibility timeout, with real prefork workers on a real mesh.

A task that hangs on its first run (acks late) is delivered again after the
visibility timeout and runs in another worker process while the first run
still hangs; the group's commit moves past it; the late run changes nothing.
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
AFTER = 6        # tasks sent after the hanging one


def _runs(db: Path, label: str) -> list[tuple[str, str, str]]:
    """(phase, host, pid) of each run of `label`, in order."""
    rows = query(db, "SELECT phase, host, label FROM notes WHERE phase IN ('hang', 'rerun') "
                     "AND label LIKE ? ORDER BY ts", f"{label} pid=%")
    return [(phase, host, text.rsplit("pid=", 1)[1]) for phase, host, text in rows]


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
        app.send_task("tests.celery.app.hang_once", args=("h", HANG_S))
        wait_for(lambda: len(_runs(db, "h")) == 1, 60, "the first run started (and hangs)")
        for n in range(AFTER):
            app.send_task("tests.celery.app.stamp", args=(f"after-{n}",))
        wait_for(lambda: len(_runs(db, "h")) == 2, 60, "the hanging task ran again")
        wait_for(lambda: len(query(db, "SELECT DISTINCT label FROM notes WHERE phase = 'run'"))
                 == AFTER, 60, "the tasks sent after it ran")
        # The commit moves past the hung message (acked by no one) once its copy is stored.
        wait_for(lambda: asyncio.run(_lag(celery_mesh.namesrv, group, queue)) == 0, 30,
                 "the group's commit passed every message, the hung one included")
        time.sleep(VISIBILITY_S + 2)   # a second timeout (wrongly) would bring a third run
    finally:
        app.close()
    (first, first_host, first_pid), (again, again_host, again_pid) = _runs(db, "h")
    assert (first, again) == ("hang", "rerun")   # and no third run
    assert (again_host, again_pid) != (first_host, first_pid)   # another worker process ...
    assert not query(db, "SELECT 1 FROM notes WHERE phase = 'done'")   # ... while it hangs
