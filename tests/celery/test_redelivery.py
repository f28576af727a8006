"""Redelivery as kombu and Celery see it, with a real worker on a real mesh.

A message that comes back through the group's retry topic carries kombu's
`delivery_info['redelivered']` and the `redelivered` header (as kombu's Redis
transport sets them), so Celery's `test_reject_with_requeue_redelivers_and_succeeds`
holds: a task rejected with requeue until it is redelivered then succeeds, once.
"""
from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from ferry.client import Admin

from tests.celery.app import make_app
from tests.celery.conftest import CeleryMesh, notes_db, proc_env, query, start_worker, wait_for
from tests.client.conftest import unique
from tests.support.procs import Proc

pytestmark = pytest.mark.integration


async def _dead_letters(namesrv: str, group: str) -> int:
    async with Admin(namesrv=namesrv) as admin:
        try:
            return sum(q.lag for q in await admin.group_lag(group, [f"%DLQ%{group}"]))
        except Exception:   # no dead-letter topic: nothing went there
            return 0


def test_reject_with_requeue_redelivers_and_succeeds(
        celery_mesh: CeleryMesh, tmp_path: Path, procs: list[Proc]) -> None:
    queue = unique("redeliver")
    db = notes_db(tmp_path / "notes.db")
    procs.append(start_worker(celery_mesh, "rd", proc_env(celery_mesh, queue, db)))
    app = make_app(celery_mesh.namesrv, queue)
    try:
        app.send_task("tests.celery.app.reject_until_redelivered", args=("r1",))
        wait_for(lambda: bool(query(db, "SELECT 1 FROM notes WHERE phase = 'redelivered'")), 60,
                 "the task saw delivery_info['redelivered'] and succeeded")
    finally:
        app.close()
    assert query(db, "SELECT label FROM notes WHERE phase = 'rejected'") == [("r1",)]
    assert query(db, "SELECT label FROM notes WHERE phase = 'redelivered'") == [
        ("r1 header=True",)]
    assert asyncio.run(_dead_letters(celery_mesh.namesrv, f"celery-{queue}")) == 0
