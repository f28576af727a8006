"""An example Celery app on Ferry: what the compose file's `worker` service runs.

    celery --workdir deploy -A celery_example worker        # a worker
    python -c 'import celery_example as c; c.add.delay(2, 3)'   # a task (from deploy/)

The broker is CELERY_BROKER_URL (Celery's own setting; the compose file sets
`ferry://namesrv:9876`), default `ferry://127.0.0.1:9876` (`make up`). With auth
on the transport signs with FERRY_ACCESS_KEY / FERRY_SECRET_KEY (the compose
file's with-identity.sh sets them). The settings are the ones docs/celery.md
recommends: a task is acknowledged after it ran, so a worker killed mid-task
loses nothing. There is no result backend: the tasks log what they did (give
your app a backend such as Redis when callers wait for results).
"""
from __future__ import annotations

import logging
import os

import ferry  # noqa: F401 - registers the ferry:// scheme with kombu before the first send
from celery import Celery

log = logging.getLogger(__name__)

app = Celery("celery_example")
app.conf.update(
    broker_url=os.environ.get("CELERY_BROKER_URL", "ferry://127.0.0.1:9876"),
    task_acks_late=True,               # ack = the offset commit, after the task ran
    task_reject_on_worker_lost=True,   # a pool child killed mid-task: deliver it again
    task_ignore_result=True,           # no result backend
    worker_prefetch_multiplier=4,
    broker_connection_retry_on_startup=True,
)


@app.task
def add(x: int, y: int) -> int:
    """Add two numbers (and log the sum: there is no result backend)."""
    log.warning("add(%s, %s) = %s", x, y, x + y)
    return x + y

