"""The compose file's `worker` service as it runs: a Celery worker on `ferry://` with the
example app deploy/celery_example.py, started by the same command line (`celery --workdir
deploy -A celery_example worker`), under the identity svc-celery-worker with the rules
deploy/auth_init.py gives it, against a mesh with auth on. A task sent with that identity
runs; a sender without rights is refused with the reason."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from ferry.auth.credentials import Credentials

from tests.auth.http_support import NOBODY
from tests.deploy.conftest import DEPLOY, Secured, compose_identity
from tests.support.procs import spawn

pytestmark = [pytest.mark.integration, pytest.mark.slow]

WORKER = compose_identity("svc-celery-worker")
CELERY = str(Path(sys.executable).parent / "celery")


def identity_env(s: Secured, creds: Credentials) -> dict[str, str]:
    return {"CELERY_BROKER_URL": f"ferry://{s.namesrv}",
            "FERRY_ACCESS_KEY": creds.access_key, "FERRY_SECRET_KEY": creds.secret_key}


def send_add(s: Secured, creds: Credentials, x: int, y: int) -> subprocess.CompletedProcess[str]:
    """`add.delay(x, y)` from a program that imports the example app (as a web app would)."""
    return subprocess.run([sys.executable, "-c", f"import celery_example as c; c.add.delay({x}, {y})"],
                          cwd=DEPLOY, env={**os.environ, **identity_env(s, creds)},
                          capture_output=True, text=True, timeout=120)


def test_the_example_worker_runs_a_task_under_its_identity(secured: Secured) -> None:
    s = secured
    worker = spawn("worker", [CELERY, "--workdir", str(DEPLOY), "-A", "celery_example",
                              "worker", "--loglevel", "INFO", "--concurrency", "2",
                              "--hostname", "example@test", "--without-mingle",
                              "--without-gossip"],
                   s.mesh.workdir / "worker", identity_env(s, WORKER))
    try:
        deadline = time.monotonic() + 90
        while " ready." not in worker.log() and worker.alive() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert " ready." in worker.log(), worker.log()[-3000:]
        sent = send_add(s, WORKER, 2, 3)
        assert sent.returncode == 0, sent.stderr[-3000:]
        while "add(2, 3) = 5" not in worker.log() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert "add(2, 3) = 5" in worker.log(), worker.log()[-3000:]
        refused = send_add(s, NOBODY, 4, 5)
        assert refused.returncode != 0
        assert "AccessDeniedError: access key 'nobody'" in refused.stderr, refused.stderr[-3000:]
        assert worker.alive(), "the worker keeps serving"
    finally:
        worker.stop()
