"""`ferry celery-bridge` with an idempotent task, across a kill -9 and restart of the bridge.

300 orders go to a topic; the bridge (a real `ferry celery-bridge` process)
sends each as the task `bill` (task id = message id) to a real worker; the
bridge is killed with -9 mid-run before it committed, started again, and sends
the uncommitted messages again. The task writes an invoice and its ledger row
in one SQLite transaction (`idempotent_task`): every order is invoiced exactly
once, and the ledger holds exactly the orders' message ids.
"""
from __future__ import annotations

import json
import sqlite3
import sys
import time
from pathlib import Path

import pytest
from ferry.client import Producer

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
from tests.support.procs import Proc, spawn

pytestmark = pytest.mark.integration

ORDERS = 300
#: How long the task counts must stay still before the run counts as settled.
QUIET_S = 3.0


def start_bridge(cm: CeleryMesh, name: str, topic: str, group: str,
                 env: dict[str, str], task: str = "tests.celery.app.bill") -> Proc:
    argv = [sys.executable, "-m", "ferry.cli.main", "--namesrv", cm.namesrv, "celery-bridge",
            "--topic", topic, "--group", group, "--task", task,
            "--app", "tests.celery.app:app", "--from", "earliest"]
    return spawn(name, argv, cm.workdir / name, env)


def settled(db: Path) -> None:
    """Until the invocation count stopped moving for QUIET_S."""
    last, since = -1, time.monotonic()
    while time.monotonic() - since < QUIET_S:
        now = query(db, "SELECT COUNT(*) FROM notes WHERE phase = 'invoked'")[0][0]
        if now != last:
            last, since = now, time.monotonic()
        time.sleep(0.2)


async def test_bridge_runs_each_message_once_across_a_kill(celery_mesh: CeleryMesh,
                                                           tmp_path: Path,
                                                           procs: list[Proc]) -> None:
    topic, group, queue = unique("orders"), unique("billing"), unique("bill-tasks")
    db = notes_db(tmp_path / "notes.db")
    biz = tmp_path / "shop.db"
    with sqlite3.connect(biz) as conn:
        conn.execute("CREATE TABLE invoices (order_id INTEGER, msg_id TEXT)")
    env = proc_env(celery_mesh, queue, db, FERRY_CELERY_TEST_BIZ_DB=str(biz))
    async with Producer(namesrv=celery_mesh.namesrv) as producer:
        sent = [await producer.send_and_wait(topic, json.dumps({"order": n}).encode())
                for n in range(ORDERS)]
    procs.append(start_worker(celery_mesh, "wbill", env, pool="threads", concurrency=4))
    bridge = start_bridge(celery_mesh, "bridge-1", topic, group, env)
    procs.append(bridge)

    def invoked() -> int:
        return int(query(db, "SELECT COUNT(*) FROM notes WHERE phase = 'invoked'")[0][0])
    wait_for(lambda: invoked() >= 50, 60, "the bridge sent 50 tasks")
    kill9(bridge)   # before its auto-commit (5 s): the restart sends them again
    procs.append(start_bridge(celery_mesh, "bridge-2", topic, group, env))
    wait_for(lambda: len(query(biz, "SELECT 1 FROM invoices")) >= ORDERS, 90,
             "every order invoiced")
    settled(db)

    invoices = query(biz, "SELECT order_id, msg_id FROM invoices ORDER BY order_id")
    assert [o for o, _ in invoices] == list(range(ORDERS))   # each exactly once
    assert {m for _, m in invoices} == {r.msg_id for r in sent}   # task id = message id
    ledger = query(biz, "SELECT scene, biz_key, msg_id, topic, queue_offset FROM ferry_ledger")
    assert len(ledger) == ORDERS
    assert set(ledger) == {("billing", r.msg_id, r.msg_id, topic, r.queue_offset) for r in sent}
    assert invoked() > ORDERS, "the restarted bridge should have sent some tasks again"
