"""`purge` on `ferry://` (kombu's `queue_purge`, `app.control.purge()`, `celery purge`):
the queue's group moves past what is stored, so nothing sent before the purge runs,
and what is sent after it does (real worker, real mesh); with auth on it needs `reset`
on the group, and a refused purge moves nothing."""
from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from ferry.client import Admin
from ferry.errors import AccessDeniedError

from tests.broker.auth_support import creds, rules, seeded_mesh
from tests.celery.app import make_app
from tests.celery.conftest import CeleryMesh, notes_db, proc_env, query, start_worker, wait_for
from tests.client.conftest import Mesh, unique
from tests.support.procs import Etcd, Proc

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


# -- with auth on: purging moves offsets, so it needs `reset` on the queue's group -----------
IDENTITIES = {
    "tasks": rules(("allow", "topic:purge-*", "pub,sub"),
                   ("allow", "group:celery-purge-*", "consume")),
    "ops": rules(("allow", "topic:purge-*", "pub,sub"),
                 ("allow", "group:celery-purge-*", "consume,reset")),
}


@pytest.fixture(scope="module")
def auth_mesh(etcd: Etcd, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mesh]:
    mesh = Mesh(etcd, tmp_path_factory.mktemp("celery-auth"), broker_env={"FERRY_AUTH": "on"})
    with seeded_mesh(mesh, IDENTITIES) as seeded:
        yield seeded


def _as(monkeypatch: pytest.MonkeyPatch, identity: str) -> None:
    c = creds(identity)
    monkeypatch.setenv("FERRY_ACCESS_KEY", c.access_key)
    monkeypatch.setenv("FERRY_SECRET_KEY", c.secret_key)


async def _lag(namesrv: str, group: str, topic: str) -> int:
    async with Admin(namesrv=namesrv, credentials=creds("ops")) as admin:
        return sum(q.lag for q in await admin.group_lag(group, [topic]))


def test_purge_without_reset_on_the_group_is_refused_and_moves_nothing(
        auth_mesh: Mesh, monkeypatch: pytest.MonkeyPatch) -> None:
    queue = unique("purge")
    _as(monkeypatch, "tasks")
    app = make_app(auth_mesh.namesrv, queue)
    try:
        for n in range(OLD):
            app.send_task("tests.celery.app.stamp", args=(f"old{n}",))
        with pytest.raises(AccessDeniedError):
            app.control.purge()
    finally:
        app.close()
    assert asyncio.run(_lag(auth_mesh.namesrv, f"celery-{queue}", queue)) == OLD
    _as(monkeypatch, "ops")
    app = make_app(auth_mesh.namesrv, queue)
    try:
        assert app.control.purge() == OLD
    finally:
        app.close()
    assert asyncio.run(_lag(auth_mesh.namesrv, f"celery-{queue}", queue)) == 0
