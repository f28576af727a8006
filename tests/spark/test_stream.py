"""Streaming reads: micro-batches while a producer sends, then a restart from the checkpoint."""
from __future__ import annotations

import asyncio
import threading
import time

import pytest
from ferry import Producer

from tests.client.conftest import Mesh
from tests.spark.conftest import message, new_topic, send_messages

pytestmark = [pytest.mark.slow, pytest.mark.integration]

BEFORE_START = 400          # sent before the query starts (startingOffsets=earliest reads them)
SEND_STEP = 50              # the sender's messages per send, every SEND_PAUSE_S
SEND_PAUSE_S = 0.2
MAX_SENT = 20_000           # the sender's bound, should the query never get going
AFTER_STOP = 300            # sent while the query is stopped
WANT_BATCHES = 5
WAIT_S = 90.0


class Sender(threading.Thread):
    """Sends message(i), i counting on, until told to stop; keeps the SendResults in order."""

    def __init__(self, namesrv: str, topic: str, first: int) -> None:
        super().__init__(daemon=True)
        self.namesrv, self.topic, self.next = namesrv, topic, first
        self.sent: list = []
        self.stop_sending = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        async def send() -> None:
            async with Producer(namesrv=self.namesrv) as producer:
                while not self.stop_sending.is_set() and self.next < MAX_SENT:
                    numbers = range(self.next, self.next + SEND_STEP)
                    self.sent += await producer.send_batch(self.topic,
                                                           [message(i) for i in numbers])
                    self.next += SEND_STEP
                    await asyncio.sleep(SEND_PAUSE_S)
        try:
            asyncio.run(send())
        except BaseException as exc:  # reported by the test
            self.error = exc


def _start(spark, mesh: Mesh, topic: str, out: str, checkpoint: str, limit: str = "",
           **trigger):
    stream = spark.readStream.format("ferry").option("namesrv", mesh.namesrv) \
        .option("topic", topic).option("startingOffsets", "earliest") \
        .option("maxOffsetsPerTrigger", limit).load()
    return stream.writeStream.format("parquet").option("path", out) \
        .option("checkpointLocation", checkpoint).trigger(**trigger).start()


def _batches_with_rows(query) -> int:
    return sum(1 for p in query.recentProgress if p["numInputRows"] > 0)


def test_stream_restarts_from_checkpoint_exactly_once(spark, spark_mesh: Mesh, tmp_path) -> None:
    topic = new_topic(spark_mesh, "spark-stream", queues=2)
    sent = asyncio.run(send_messages(spark_mesh.namesrv, topic, range(BEFORE_START)))
    out, checkpoint = str(tmp_path / "out"), str(tmp_path / "checkpoint")
    sender = Sender(spark_mesh.namesrv, topic, BEFORE_START)
    query = _start(spark, spark_mesh, topic, out, checkpoint, limit="300",
                   processingTime="500 milliseconds")
    sender.start()
    try:
        deadline = time.monotonic() + WAIT_S
        while _batches_with_rows(query) < WANT_BATCHES and time.monotonic() < deadline:
            assert query.exception() is None, query.exception()
            time.sleep(0.2)
        assert _batches_with_rows(query) >= WANT_BATCHES
        assert sender.is_alive()    # the batches were read while the producer sent
    finally:
        query.stop()
        sender.stop_sending.set()
        sender.join()
    assert sender.error is None
    sent += sender.sent
    assert 0 < spark.read.parquet(out).count() < len(sent)
    # While the query is stopped, more arrive.
    sent += asyncio.run(send_messages(spark_mesh.namesrv, topic,
                                      range(sender.next, sender.next + AFTER_STOP)))
    # Restarted from the checkpoint (no batch limit now): reads what the first run left,
    # up to the end as it is now, then stops.
    query = _start(spark, spark_mesh, topic, out, checkpoint, availableNow=True)
    query.awaitTermination(WAIT_S)
    assert query.exception() is None
    rows = spark.read.parquet(out).select("msg_id", "body").collect()
    ids = [r.msg_id for r in rows]
    assert len(ids) == len(set(ids)) == len(sent)          # every message, exactly once
    assert set(ids) == {s.msg_id for s in sent}
    bodies = {r.msg_id: bytes(r.body) for r in rows}
    assert all(bodies[s.msg_id] == message(i).body for i, s in enumerate(sent))
