"""The queue reader reads again what a replaced log holds (issue 16), on real processes.

A namesrv and a broker; a QueueReader follows a one-queue topic and takes six
messages. The broker is killed with SIGKILL, its data directory removed, and
started again empty; nine new messages go to the same queue at offsets 0..8.
The reader's next PULL (at 6) names the history of what it read, the broker
answers HISTORY_DIVERGED back to 0, and the reader takes all nine: a reader
without history ids would go on at 6 and skip the first six new ones.
"""
from __future__ import annotations

import asyncio
import shutil

import pytest
from ferry import Admin
from ferry.client.core.connection import ConnectionPool
from ferry.client.core.namesrv import NamesrvClient
from ferry.client.reading import Cursor, QueueReader, ReadConfig, ReadQueue
from ferry.codec import StoredMessage
from ferry.wire import PullAnswer

from tests.client.conftest import FAST_EXPIRY_ENV, Mesh, start_mesh, unique
from tests.client.util import send_all
from tests.support.procs import Etcd

pytestmark = pytest.mark.integration

WAIT_S = 30.0


class Collect(QueueReader):
    """Keeps one cursor per queue (across task restarts) and every body and status."""

    def __init__(self, pool: ConnectionPool, namesrv: NamesrvClient, topic: str) -> None:
        super().__init__(pool, namesrv, topic, ReadConfig("ferry-test-reader", 32, 500, 200))
        self.cursors: dict[ReadQueue, Cursor] = {}
        self.bodies: list[bytes] = []
        self.statuses: list[str] = []

    async def open(self, queue: ReadQueue) -> Cursor:
        key = ReadQueue(queue.broker, "", queue.topic, queue.queue_id)
        return self.cursors.setdefault(key, Cursor(0))

    async def take(self, queue: ReadQueue, records: list[StoredMessage],
                   answer: PullAnswer) -> int:
        self.bodies += [bytes(r.body) for r in records]
        return answer.next_offset

    def answered(self, queue: ReadQueue, answer: PullAnswer, sent_ms: int) -> None:
        self.statuses.append(answer.status.value)


@pytest.fixture
def one_broker(etcd: Etcd, tmp_path):  # type: ignore[no-untyped-def]
    m = start_mesh(etcd, tmp_path / "mesh", ("broker-a",), broker_env=FAST_EXPIRY_ENV)
    yield m
    m.stop()


async def _until(cond, what: str) -> None:  # type: ignore[no-untyped-def]
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT_S
    while not cond():
        assert loop.time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


async def test_the_reader_reads_a_replaced_log_again_from_where_it_parts(
        one_broker: Mesh) -> None:
    mesh, topic = one_broker, unique("reader")
    async with Admin(namesrv=mesh.namesrv) as admin:
        await admin.create_topic(topic, queues=1)
    old = [f"old-{i}".encode() for i in range(6)]
    await send_all(mesh.namesrv, topic, old)
    pool, namesrv = ConnectionPool(), NamesrvClient(mesh.namesrv)
    reader = handler = Collect(pool, namesrv, topic)
    task = asyncio.create_task(reader.run())
    try:
        await _until(lambda: handler.bodies == old, "the first six")
        (cursor,) = handler.cursors.values()
        assert cursor.offset == 6 and cursor.hist is not None
        broker = mesh.brokers["broker-a"]
        broker.proc.kill9()
        shutil.rmtree(broker.data_dir)
        mesh.start_broker("broker-a")
        new = [f"new-{i}".encode() for i in range(9)]
        await send_all(mesh.namesrv, topic, new)
        await _until(lambda: len(handler.bodies) >= 6 + len(new), "the nine new messages")
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await reader.stop()
        await pool.close()
        await namesrv.close()
    assert handler.bodies[6:] == new
    assert "HISTORY_DIVERGED" in handler.statuses
    assert cursor.offset == 9
