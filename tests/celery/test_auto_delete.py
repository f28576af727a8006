"""kombu's auto-delete queues (Celery's `<uuid>.reply.celery.pidbox`, `celeryev.<uuid>`) on
`ferry://`: the queue's topic is deleted when its last consumer leaves, and a durable
queue's topic stays (kombu connections on a real mesh)."""
from __future__ import annotations

import asyncio
import time
import uuid

import kombu
import pytest
from ferry.celery.naming import topic_for_queue
from ferry.celery.topics import topic_exists

from tests.celery.app import TRANSPORT_OPTIONS
from tests.celery.conftest import CeleryMesh, wait_for
from tests.client.conftest import unique

pytestmark = pytest.mark.integration


def _consumer(namesrv: str, queue: kombu.Queue, got: list[str]) -> kombu.Connection:
    conn = kombu.Connection(f"ferry://{namesrv}", transport_options=TRANSPORT_OPTIONS)

    def on_message(body: str, message: kombu.Message) -> None:
        got.append(body)
        message.ack()
    conn.Consumer([queue], callbacks=[on_message], accept=["json"]).consume()
    return conn


def _drain(conns: list[kombu.Connection], got: list[str], n: int) -> None:
    deadline = time.monotonic() + 30
    while len(got) < n:
        assert time.monotonic() < deadline, f"{len(got)} of {n} messages"
        for conn in conns:
            try:
                conn.drain_events(timeout=0.2)
            except TimeoutError:
                pass


def test_an_auto_delete_queue_goes_with_its_last_consumer(celery_mesh: CeleryMesh) -> None:
    ns = celery_mesh.namesrv
    exchange = kombu.Exchange("reply.celery.pidbox", type="direct", durable=False)
    name = f"{uuid.uuid4()}.reply.celery.pidbox"
    reply = kombu.Queue(name, exchange, routing_key=name, auto_delete=True, durable=False)
    durable = kombu.Queue(unique("kept"), kombu.Exchange("kept", type="direct"),
                          routing_key="kept")
    got: list[str] = []
    first, second = _consumer(ns, reply, got), _consumer(ns, reply, got)
    kept = _consumer(ns, durable, got)
    try:
        with kombu.Connection(f"ferry://{ns}", transport_options=TRANSPORT_OPTIONS) as sender:
            producer = sender.Producer(serializer="json")
            producer.publish("pong", exchange=exchange, routing_key=name, declare=[reply])
            producer.publish("task", exchange=durable.exchange, routing_key="kept",
                             declare=[durable])
        _drain([first, second, kept], got, 2)
        assert set(got) == {"pong", "task"}   # (twice, if a rebalance moved it: at least once)
        topic = topic_for_queue(name)
        first.release()
        assert asyncio.run(topic_exists(ns, topic))   # the other consumer is still on it
        second.release()
        # Gone from namesrv at once; from the broker's registration (the route) within a moment.
        wait_for(lambda: not asyncio.run(topic_exists(ns, topic)), 10, "the reply topic deleted")
        kept.release()
        assert asyncio.run(topic_exists(ns, topic_for_queue(durable.name)))
    finally:
        for conn in (first, second, kept):
            conn.release()


def test_a_reply_to_a_reply_queue_that_is_gone_is_dropped(celery_mesh: CeleryMesh) -> None:
    """A worker answering after its caller left (`inspect(timeout=...)` ran out): the reply
    goes nowhere, as AMQP drops it, and does not bring the caller's topic back."""
    ns = celery_mesh.namesrv
    exchange = kombu.Exchange("reply.celery.pidbox", type="direct", durable=False)
    oid = str(uuid.uuid4())
    name = f"{oid}.reply.celery.pidbox"
    reply = kombu.Queue(name, exchange, routing_key=oid, auto_delete=True, durable=False)
    got: list[str] = []
    caller = _consumer(ns, reply, got)
    with kombu.Connection(f"ferry://{ns}", transport_options=TRANSPORT_OPTIONS) as worker:
        producer = worker.Producer(serializer="json")
        producer.publish("in time", exchange=exchange, routing_key=oid)
        _drain([caller], got, 1)
        assert got == ["in time"]
        caller.release()   # the caller leaves: its reply queue goes
        topic = topic_for_queue(name)
        wait_for(lambda: not asyncio.run(topic_exists(ns, topic)), 10, "the reply topic deleted")
        producer.publish("too late", exchange=exchange, routing_key=oid)   # no error
        time.sleep(1)
        assert not asyncio.run(topic_exists(ns, topic))
