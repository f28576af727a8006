"""Remote control and events on `ferry://`: two real prefork workers (`-E`) on a real mesh.

- `celery inspect ping` (the CLI) answers from both workers, `inspect stats` too;
- `app.control.revoke` of a task waiting for its countdown: both workers confirm,
  and the task never runs while a task sent after it does;
- `inspect active` lists a running task; `revoke(terminate=True)` ends it;
- a real event receiver sees both workers' heartbeats and a task's `task-succeeded`;
- Flower started against `ferry://` lists both workers and the task (slow);
- `celery control rate_limit` answers from both; `control shutdown -d` stops one.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from celery.events.receiver import EventReceiver

from tests.celery import conftest as cf
from tests.celery.app import make_app
from tests.client.conftest import unique
from tests.support.procs import Proc, free_port, spawn

pytestmark = pytest.mark.integration

WORKERS = ("wr1@test", "wr2@test")
#: Events on, event heartbeats on (Flower's and the receiver's view of the workers).
EVENT_WORKER = ("--without-mingle", "--without-gossip", "-E")
REPLY_TIMEOUT_S = 15.0


class Remote:
    """The module's two workers, their queue, their notes and an app to talk to them."""

    def __init__(self, cm: cf.CeleryMesh, queue: str, db: Path) -> None:
        self.cm, self.queue, self.db = cm, queue, db
        self.env = cf.proc_env(cm, queue, db)
        self.app = make_app(cm.namesrv, queue)
        self.procs: list[Proc] = []

    def celery(self, *args: str) -> subprocess.CompletedProcess[str]:
        """The `celery` command, as a user runs it against the workers' app."""
        return subprocess.run([sys.executable, "-m", "celery", "-A", "tests.celery.app", *args],
                              env={**os.environ, **self.env}, capture_output=True, text=True,
                              timeout=120, cwd=self.cm.workdir)

    def inspect(self, **kwargs: Any) -> Any:
        """`app.control.inspect()` that returns as soon as both workers answered."""
        return self.app.control.inspect(timeout=REPLY_TIMEOUT_S, limit=len(WORKERS), **kwargs)

    def noted(self, phase: str) -> set[str]:
        return {r[0] for r in cf.query(self.db, "SELECT label FROM notes WHERE phase = ?", phase)}


@pytest.fixture(scope="module")
def remote(celery_mesh: cf.CeleryMesh,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[Remote]:
    db = cf.notes_db(tmp_path_factory.mktemp("remote") / "n.db")
    r = Remote(celery_mesh, unique("remote"), db)
    try:
        for name in WORKERS:
            r.procs.append(cf.start_worker(celery_mesh, name.split("@")[0], r.env,
                                        options=EVENT_WORKER))
        yield r
    finally:
        r.app.close()
        for proc in r.procs:
            if proc.alive():
                cf.kill9(proc)


def test_celery_inspect_ping_answers_from_both_workers(remote: Remote) -> None:
    out = remote.celery("inspect", "ping", "--timeout", str(REPLY_TIMEOUT_S), "--json")
    assert out.returncode == 0, out.stderr + out.stdout
    replies = json.loads(out.stdout)
    assert replies == {name: {"ok": "pong"} for name in WORKERS}
    stats = remote.inspect().stats()
    assert set(stats or {}) == set(WORKERS)
    assert all(s["broker"]["transport"] == "ferry" for s in stats.values())


def test_inspect_to_one_worker_answers_from_it_only(remote: Remote) -> None:
    out = remote.celery("inspect", "ping", "-d", WORKERS[1], "--timeout",
                        str(REPLY_TIMEOUT_S), "--json")
    assert out.returncode == 0, out.stderr + out.stdout
    assert json.loads(out.stdout) == {WORKERS[1]: {"ok": "pong"}}
    # a worker that does not exist: no reply, and the command says so
    out = remote.celery("inspect", "ping", "-d", "nobody@test", "--timeout", "3")
    assert out.returncode != 0
    assert "No nodes replied" in out.stdout + out.stderr


def test_each_of_repeated_calls_gets_its_own_reply(remote: Remote) -> None:
    """The caller's reply queue is the same for every call of one app, consumed with
    no_ack: a reply taken by one call is not delivered again to the next (where, with
    `limit=1`, it would end that call with no answer of its own)."""
    for _ in range(8):
        replies = remote.app.control.inspect(destination=[WORKERS[0]], limit=1,
                                             timeout=REPLY_TIMEOUT_S).ping()
        assert replies == {WORKERS[0]: {"ok": "pong"}}


def test_revoke_of_a_pending_countdown_task_prevents_its_run(remote: Remote) -> None:
    label, marker = unique("revoked"), unique("marker")
    pending = remote.app.send_task("tests.celery.app.stamp", args=(label,), countdown=4)
    replies = remote.app.control.revoke(pending.id, reply=True, timeout=REPLY_TIMEOUT_S,
                                        limit=len(WORKERS))
    assert {name for reply in replies for name in reply} == set(WORKERS)
    remote.app.send_task("tests.celery.app.stamp", args=(marker,), countdown=4)
    cf.wait_for(lambda: marker in remote.noted("run"), 60,
                "the task sent after the revoked one ran")
    assert label not in remote.noted("run")
    revoked = remote.inspect().revoked() or {}
    assert set(revoked) == set(WORKERS)
    assert all(pending.id in ids for ids in revoked.values())


def test_inspect_active_lists_a_running_task_and_revoke_terminates_it(remote: Remote) -> None:
    running = remote.app.send_task("tests.celery.app.record", args=(7_001, 120.0))
    cf.wait_for(lambda: "7001" in remote.noted("start"), 60, "the long task started")

    def active_ids() -> set[str]:
        active = remote.inspect().active() or {}
        return {task["id"] for tasks in active.values() for task in tasks}
    assert running.id in active_ids()
    out = remote.celery("inspect", "active", "--timeout", str(REPLY_TIMEOUT_S), "--json")
    assert running.id in out.stdout, out.stderr + out.stdout
    remote.app.control.revoke(running.id, terminate=True, signal="SIGKILL")
    cf.wait_for(lambda: running.id not in active_ids(), 60, "the terminated task left `active`")
    assert "7001" not in remote.noted("done")


class ReadyReceiver(EventReceiver):
    """Celery's event receiver, telling when its queue is consumed."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.ready = threading.Event()

    def on_consume_ready(self, *args: Any, **kwargs: Any) -> None:
        super().on_consume_ready(*args, **kwargs)
        self.ready.set()


def test_event_receiver_sees_heartbeats_and_task_succeeded(remote: Remote) -> None:
    seen: list[dict[str, Any]] = []
    app: Celery = remote.app
    with app.connection_for_read() as conn:
        receiver = ReadyReceiver(conn, handlers={"*": seen.append}, app=app)
        capture = threading.Thread(target=receiver.capture, kwargs={"wakeup": True}, daemon=True)
        capture.start()
        try:
            assert receiver.ready.wait(60), "the receiver never consumed"
            result = app.send_task("tests.celery.app.stamp", args=(unique("evented"),))
            cf.wait_for(lambda: any(e["type"] == "task-succeeded" and e.get("uuid") == result.id
                                 for e in list(seen)), 60, "task-succeeded of the task")
            # on_consume_ready's wakeup asked every worker for a heartbeat (remote control)
            cf.wait_for(lambda: {e["hostname"] for e in list(seen)
                              if e["type"] == "worker-heartbeat"} >= set(WORKERS), 60,
                     "a heartbeat from each worker")
            types = {e["type"] for e in list(seen) if e.get("uuid") == result.id}
            assert {"task-received", "task-started", "task-succeeded"} <= types
        finally:
            receiver.should_stop = True
            capture.join(30)


@pytest.mark.slow
def test_flower_shows_both_workers_and_a_task(remote: Remote) -> None:
    port = free_port()
    flower = spawn("flower", [sys.executable, "-m", "celery", "-A", "tests.celery.app", "flower",
                              f"--port={port}", "--address=127.0.0.1", "--inspect_timeout=10000"],
                   remote.cm.workdir / "flower",
                   {**remote.env, "FLOWER_UNAUTHENTICATED_API": "true"})
    remote.procs.append(flower)
    base = f"http://127.0.0.1:{port}"

    def get(path: str) -> Any:
        try:
            with urllib.request.urlopen(base + path, timeout=30) as resp:
                body = resp.read()
        except OSError:
            return None
        return body if path == "/healthcheck" else json.loads(body)
    cf.wait_for(lambda: get("/healthcheck") == b"OK" or not flower.alive(), 60, "flower up")
    assert flower.alive(), flower.log()[-3000:]
    cf.wait_for(lambda: set(get("/api/workers?refresh=1") or {}) >= set(WORKERS), 90,
             "flower lists both workers")
    # Flower's event receiver started with it (a queue bound now gets events from now on)
    label = unique("flowered")
    result = remote.app.send_task("tests.celery.app.stamp", args=(label,))
    cf.wait_for(lambda: label in remote.noted("run"), 60, "the task ran")
    cf.wait_for(lambda: (get("/api/tasks") or {}).get(result.id, {}).get("state") == "SUCCESS",
             90, "flower shows the task succeeded")
    task = get("/api/tasks")[result.id]
    assert task["worker"] in WORKERS and task["name"] == "tests.celery.app.stamp"


def test_no_reply_pidbox_or_event_queue_is_left_as_a_topic(remote: Remote) -> None:
    for _ in range(3):   # each call declares its reply queue again and leaves it
        assert set(remote.inspect().ping() or {}) == set(WORKERS)
    cf.none_left(remote.cm.namesrv)
    # the workers (pidbox queues, events on) still answer, and still leave nothing behind
    # (a reply after its caller left: test_auto_delete.py)
    assert set(remote.inspect().ping() or {}) == set(WORKERS)
    cf.none_left(remote.cm.namesrv)


def replies_of(stdout: str) -> dict[str, Any]:
    """`celery control --json` prints a list of {node: reply}."""
    return {node: reply for item in json.loads(stdout) for node, reply in item.items()}


def test_celery_control_rate_limit_then_shutdown(remote: Remote) -> None:
    out = remote.celery("control", "rate_limit", "tests.celery.app.stamp", "100/m",
                        "--timeout", str(REPLY_TIMEOUT_S), "--json")
    assert out.returncode == 0, out.stderr + out.stdout
    assert set(replies_of(out.stdout)) == set(WORKERS)
    conf = remote.inspect().conf() or {}
    assert set(conf) == set(WORKERS)
    # a task name no worker knows: refused by each, and every worker keeps serving
    out = remote.celery("control", "rate_limit", "no.such.task", "1/s",
                        "--timeout", str(REPLY_TIMEOUT_S), "--json")
    assert all("error" in reply for reply in replies_of(out.stdout).values()), out.stdout
    # a worker does not reply to shutdown (Celery raises WorkerShutdown first): it exits
    remote.celery("control", "shutdown", "-d", WORKERS[1], "--timeout", "3")
    remote.procs[1].popen.wait(timeout=60)   # the worker exits: shutdown reached it
    assert remote.procs[0].alive()
    replies = remote.app.control.inspect(timeout=5).ping() or {}
    assert set(replies) == {WORKERS[0]}
