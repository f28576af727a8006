"""The Celery app the tests' worker processes run (`celery -A tests.celery.app worker`).

Configured by the environment the test gives each worker: FERRY_CELERY_TEST_NAMESRV
(the mesh), FERRY_CELERY_TEST_QUEUE (the queue = topic of one test),
FERRY_CELERY_TEST_DB (SQLite file where tasks note what ran where),
FERRY_CELERY_TEST_BIZ_DB (the bridge test's business database, with the ledger) and
FERRY_CELERY_TEST_VISIBILITY_S (the transport's `visibility_timeout`, when set),
FERRY_CELERY_TEST_WINDOW (the transport's `window`) and FERRY_CELERY_TEST_CONF (more
Celery settings, JSON).
"""
from __future__ import annotations

import json
import os
import sqlite3
import time
from typing import Any

from celery import Celery, current_task
from celery.exceptions import Reject
from celery.signals import task_received
from ferry.celery import idempotent_task
from ferry.idempotence import Ledger

#: Fast group membership so a killed worker's queues move within seconds in tests.
TRANSPORT_OPTIONS: dict[str, Any] = {"heartbeat_interval_ms": 1_000, "rebalance_interval_ms": 1_000,
                                     "commit_interval_ms": 500, "window": 32, "topic_queues": 8}
if os.environ.get("FERRY_CELERY_TEST_VISIBILITY_S"):
    TRANSPORT_OPTIONS["visibility_timeout"] = float(os.environ["FERRY_CELERY_TEST_VISIBILITY_S"])
if os.environ.get("FERRY_CELERY_TEST_WINDOW"):
    TRANSPORT_OPTIONS["window"] = int(os.environ["FERRY_CELERY_TEST_WINDOW"])


def make_app(namesrv: str, queue: str, **conf: Any) -> Celery:
    """The tests' app; `conf`: more Celery settings (the worker's come from FERRY_CELERY_TEST_CONF,
    JSON)."""
    app = Celery("ferry_celery_test", broker=f"ferry://{namesrv}")
    app.conf.update({"task_acks_late": True, "task_reject_on_worker_lost": True,
                     "worker_prefetch_multiplier": 4, "task_default_queue": queue,
                     "broker_transport_options": TRANSPORT_OPTIONS,
                     "broker_connection_retry_on_startup": True,
                     "worker_hijack_root_logger": False, **conf})
    return app


app = make_app(os.environ.get("FERRY_CELERY_TEST_NAMESRV", "127.0.0.1:9876"),
               os.environ.get("FERRY_CELERY_TEST_QUEUE", "celery"),
               **json.loads(os.environ.get("FERRY_CELERY_TEST_CONF") or "{}"))

NOTES_SCHEMA = ("CREATE TABLE IF NOT EXISTS notes (task_id TEXT, host TEXT, phase TEXT, "
                "label TEXT, retries INTEGER, ts REAL)")


def note(phase: str, label: Any, *, task_id: str | None = None, host: str | None = None,
         retries: int = 0) -> None:
    """One row of what happened where (each its own short transaction)."""
    path = os.environ.get("FERRY_CELERY_TEST_DB")
    if not path:
        return
    if task_id is None:
        task_id, host = current_task.request.id, current_task.request.hostname
    conn = sqlite3.connect(path, timeout=60)
    try:
        with conn:
            conn.execute("INSERT INTO notes VALUES (?, ?, ?, ?, ?, ?)",
                         (task_id, host, phase, str(label), retries, time.time()))
    finally:
        conn.close()


@task_received.connect
def _received(request: Any = None, **_: Any) -> None:
    # In the worker's main process, when a message is taken (before any ack).
    note("received", "", task_id=request.id, host=request.hostname)


@app.task(name="tests.celery.app.record")
def record(n: int, sleep_s: float = 0.0) -> int:
    note("start", n)
    time.sleep(sleep_s)
    note("done", n)
    return n


@app.task(name="tests.celery.app.stamp")
def stamp(label: str) -> None:
    note("run", label)


@app.task(name="tests.celery.app.hang_once")
def hang_once(label: str, hang_s: float, hang_on: str | None = None) -> None:
    """Hangs `hang_s` the first time it runs for `label` (on worker `hang_on` only, when
    given: elsewhere it notes `ran`), returns at once after that; notes `hang` / `rerun`
    with the pool process's pid (`label pid=N`), and `done` after a hang."""
    first = not _noted("hang", label)
    if first and hang_on not in (None, current_task.request.hostname):
        note("ran", label)
        return
    note("hang" if first else "rerun", f"{label} pid={os.getpid()}")
    if first:
        time.sleep(hang_s)
        note("done", label)


@app.task(name="tests.celery.app.requeue_once")
def requeue_once(label: str) -> None:
    """Rejected with requeue the first time (back through the group's retry topic), noted
    `requeued` where it runs then: the worker that serves the retry queue."""
    if not _noted("rejected", label):
        note("rejected", f"{label} pid={os.getpid()}")
        raise Reject("probe", requeue=True)
    note("requeued", label)


def _noted(phase: str, label: str) -> bool:
    conn = sqlite3.connect(os.environ["FERRY_CELERY_TEST_DB"], timeout=60)
    try:
        return conn.execute("SELECT 1 FROM notes WHERE phase = ? AND label LIKE ?",
                            (phase, f"{label} pid=%")).fetchone() is not None
    finally:
        conn.close()


@app.task(name="tests.celery.app.flaky", bind=True, max_retries=3)
def flaky(self: Any, label: str) -> None:
    note("attempt", label, retries=self.request.retries)
    if self.request.retries == 0:
        raise self.retry(countdown=1)


# -- the bridge's task: a business row and a ledger row in one SQLite transaction ---------
ledger = Ledger(group="billing")


def _business_db() -> sqlite3.Connection:
    return sqlite3.connect(os.environ["FERRY_CELERY_TEST_BIZ_DB"], timeout=60)


@idempotent_task(ledger, connect=_business_db, scene="billing")
def _bill(body: dict[str, Any], meta: dict[str, Any], *, conn: sqlite3.Connection) -> None:
    conn.execute("INSERT INTO invoices (order_id, msg_id) VALUES (?, ?)",
                 (body["order"], meta["msg_id"]))


@app.task(name="tests.celery.app.bill")
def bill(body: dict[str, Any], meta: dict[str, Any]) -> None:
    note("invoked", body["order"])
    _bill(body, meta)


@app.task(name="tests.celery.app.echo")
def echo(body: Any, meta: dict[str, Any]) -> None:
    """The tracing test's bridge task: notes the message id it ran for."""
    note("echo", meta["msg_id"])


@app.task(name="tests.celery.app.reject_until_redelivered", bind=True)
def reject_until_redelivered(self: Any, label: str) -> None:
    """Celery's `test_reject_with_requeue_redelivers_and_succeeds`: rejected (requeue) until
    kombu's `delivery_info['redelivered']` says it came back; notes the `redelivered` header."""
    if not (self.request.delivery_info or {}).get("redelivered"):
        note("rejected", label)
        raise Reject("not redelivered yet", requeue=True)
    note("redelivered", f"{label} header={getattr(self.request, 'redelivered', None)}")


@app.task(name="tests.celery.app.limited", rate_limit="10/s")
def limited(label: str) -> None:
    """Rate limited to 10 a second (per worker, Celery's token bucket)."""
    note("run", label)
