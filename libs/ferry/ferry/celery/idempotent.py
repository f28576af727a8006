"""Idempotent Celery tasks: a ledger row per task id, in the task's own DB transaction.

Celery on Ferry runs a task at least once: a worker killed before its ack, or
a bridge killed before its commit, makes the task run again with the same
task id (the bridge's task id is the Ferry message id). `idempotent_task`
makes the second run a no-op:

    ledger = Ledger(group="billing")

    @app.task(acks_late=True)
    @idempotent_task(ledger, connect=lambda: sqlite3.connect("shop.db"))
    def bill(body, meta, *, conn):
        conn.execute("INSERT INTO invoices ...")   # the business write, same transaction

The wrapper opens a connection with `connect()`, inserts the ledger row
(scene = the task name unless given, business key = the task id) FIRST, calls
the task with `conn=`, and commits both together. A duplicate finds the row:
`DuplicateMessage` rolls the transaction back and the task returns `None`
without running (logged at info). Any other exception rolls back and
propagates (Celery's retry / failure handling as usual); the retry runs
under the same task id, so it is the one that records.
"""
from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from ferry.errors import DuplicateMessage
from ferry.idempotence import Ledger

log = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Any])

#: Headers the bridge adds so the ledger row names the Ferry message exactly.
HEADER_TOPIC = "ferry_topic"
HEADER_QUEUE_ID = "ferry_queue_id"
HEADER_QUEUE_OFFSET = "ferry_queue_offset"
HEADER_KEY = "ferry_key"


@dataclass(frozen=True)
class TaskRef:
    """A task run as the ledger sees a message (`ferry.idempotence.ledger.MessageRef`).

    `msg_id` is the task id; topic / queue come from the bridge's headers
    when it sent the task, else the queue the task came from (offset -1).
    `key` is None, so the business key is the task id unless given.
    """

    msg_id: str
    topic: str
    queue_id: int = -1
    queue_offset: int = -1
    key: str | None = None

    @classmethod
    def of(cls, request: Any) -> TaskRef:
        """From a Celery task request (`self.request` / `current_task.request`)."""
        def header(name: str) -> Any:
            return getattr(request, name, None)
        delivery = getattr(request, "delivery_info", None) or {}
        topic = header(HEADER_TOPIC) or delivery.get("routing_key") or "celery"
        return cls(msg_id=str(request.id), topic=str(topic),
                   queue_id=_int(header(HEADER_QUEUE_ID)),
                   queue_offset=_int(header(HEADER_QUEUE_OFFSET)))


def _int(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return -1


def idempotent_task(ledger: Ledger, connect: Callable[[], Any], *, scene: str | None = None,
                    close: bool = True) -> Callable[[F], F]:
    """Decorate a task function so it runs once per task id (see the module docstring).

    `connect()` returns a DB-API connection the ledger supports (sqlite3,
    psycopg, SQLAlchemy `Connection`) with a transaction open on first use;
    it is committed or rolled back here, and closed unless `close=False`.
    """
    def decorate(fn: F) -> F:
        @functools.wraps(fn)
        def once(*args: Any, **kwargs: Any) -> Any:
            from celery import current_task
            task = current_task
            if task is None or task.request.id is None:
                raise RuntimeError("idempotent_task runs inside a Celery task only")
            ref = TaskRef.of(task.request)
            conn = connect()
            try:
                try:
                    ledger.record(conn, scene=scene or task.name, record=ref,
                                  biz_key=ref.msg_id)
                    result = fn(*args, conn=conn, **kwargs)
                except DuplicateMessage:
                    conn.rollback()
                    log.info("task %s[%s] already done: skipped", task.name, ref.msg_id)
                    return None
                except BaseException:
                    conn.rollback()
                    raise
                conn.commit()
                return result
            finally:
                if close:
                    conn.close()
        return once  # type: ignore[return-value]
    return decorate
