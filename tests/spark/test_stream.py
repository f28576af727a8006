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

TOTAL = 2_000
BEFORE_START = 400          # sent before the query starts (startingOffsets=earliest reads them)
SEND_STEP = 100
WANT_BATCHES = 5
WAIT_S = 90.0


def _send_slowly(namesrv: str, topic: str, numbers: range, sent: list, done: threading.Event
                 ) -> None:
    async def run() -> None:
        async with Producer(namesrv=namesrv) as producer:
            items = list(numbers)
            for at in range(0, len(items), SEND_STEP):
                sent.extend(await producer.send_batch(
                    topic, [message(i) for i in items[at:at + SEND_STEP]]))
                await asyncio.sleep(0.1)
    try:
        asyncio.run(run())
    finally:
        done.set()


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
    done = threading.Event()
    sender = threading.Thread(target=_send_slowly, args=(
        spark_mesh.namesrv, topic, range(BEFORE_START, TOTAL), sent, done), daemon=True)
    query = _start(spark, spark_mesh, topic, out, checkpoint, limit="300",
                   processingTime="500 milliseconds")
    sender.start()
    try:
        deadline = time.monotonic() + WAIT_S
        while _batches_with_rows(query) < WANT_BATCHES and time.monotonic() < deadline:
            assert query.exception() is None, query.exception()
            time.sleep(0.2)
        assert _batches_with_rows(query) >= WANT_BATCHES
    finally:
        query.stop()
    first_run = spark.read.parquet(out).count()
    assert 0 < first_run
    assert done.wait(WAIT_S)
    sender.join()
    assert len(sent) == TOTAL
    # Restarted from the checkpoint (with no batch limit now): reads what the first run left,
    # up to the end as it is now, then stops.
    query = _start(spark, spark_mesh, topic, out, checkpoint, availableNow=True)
    query.awaitTermination(WAIT_S)
    assert query.exception() is None
    rows = spark.read.parquet(out).select("msg_id", "broker", "queue_id", "queue_offset",
                                          "body").collect()
    ids = [r.msg_id for r in rows]
    assert len(ids) == len(set(ids)) == TOTAL          # every message, exactly once
    assert set(ids) == {s.msg_id for s in sent}
    by_id = {r.msg_id: r for r in rows}
    for i, s in enumerate(sent[:BEFORE_START]):
        assert bytes(by_id[s.msg_id].body) == message(i).body
