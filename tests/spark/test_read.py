"""Batch reads over the network: every queue of a topic, between offsets or times, exactly."""
from __future__ import annotations

import asyncio
import datetime as dt
import json

import pytest
from ferry_spark import SCHEMA

from tests.client.conftest import Mesh
from tests.spark.conftest import message, new_topic, send_messages

pytestmark = [pytest.mark.slow, pytest.mark.integration]

COUNT = 10_000


@pytest.fixture(scope="module")
def loaded(spark_mesh: Mesh) -> tuple[str, list]:
    """A topic of 8 queues (4 on each of 2 brokers) holding COUNT messages."""
    topic = new_topic(spark_mesh, "spark-read", queues=4)
    results = asyncio.run(send_messages(spark_mesh.namesrv, topic, range(COUNT)))
    return topic, results


def _utc_ms(ts: dt.datetime) -> int:
    """Epoch ms of a collected timestamp (PySpark hands out naive datetimes in local time)."""
    return round(ts.timestamp() * 1000)


def test_batch_read_returns_exactly_every_message(spark, spark_mesh: Mesh, loaded) -> None:
    topic, results = loaded
    df = spark.read.format("ferry").option("namesrv", spark_mesh.namesrv) \
        .option("topic", topic).load()
    assert df.schema == SCHEMA
    assert df.rdd.getNumPartitions() == 8   # one partition per queue
    rows = df.collect()
    assert len(rows) == COUNT
    by_id = {r.msg_id: r for r in rows}
    assert len(by_id) == COUNT
    assert len({(r.broker, r.queue_id) for r in rows}) == 8
    for i, sent in enumerate(results):
        row = by_id[sent.msg_id]
        want = message(i)
        assert (row.topic, row.broker, row.queue_id, row.queue_offset) == \
            (topic, sent.broker, sent.queue_id, sent.queue_offset)
        assert bytes(row.body) == want.body
        assert row.key == (" ".join(([want.key] if want.key else []) + list(want.keys)) or None)
        assert row.tags == want.tags
        user = {k: v for k, v in row.properties.items() if k in want.properties}
        assert user == dict(want.properties)
        assert row.reconsume_times == 0
        born, stored = _utc_ms(row.born_ts), _utc_ms(row.store_ts)
        assert 0 <= stored - born < 60_000


def test_batch_read_between_offsets(spark, spark_mesh: Mesh, loaded) -> None:
    topic, results = loaded
    first = results[0]
    spec = json.dumps({first.broker: {str(first.queue_id): 10}})
    end = json.dumps({first.broker: {str(first.queue_id): 25}})
    df = spark.read.format("ferry").option("namesrv", spark_mesh.namesrv) \
        .option("topic", topic).option("startingOffsets", spec) \
        .option("endingOffsets", end).load()
    rows = df.where(f"broker = '{first.broker}' and queue_id = {first.queue_id}").collect()
    assert sorted(r.queue_offset for r in rows) == list(range(10, 25))
    # the other queues are read whole (earliest to latest)
    assert df.count() == COUNT - 10 - (sum(1 for r in results if (r.broker, r.queue_id) ==
                                             (first.broker, first.queue_id)) - 25)


def test_batch_read_by_time(spark, spark_mesh: Mesh, loaded) -> None:
    topic, _ = loaded
    base = spark.read.format("ferry").option("namesrv", spark_mesh.namesrv) \
        .option("topic", topic).load()
    stamps = sorted(_utc_ms(r.store_ts) for r in base.select("store_ts").collect())
    cut = stamps[len(stamps) // 2]
    later = spark.read.format("ferry").option("namesrv", spark_mesh.namesrv) \
        .option("topic", topic).option("startingTimestampMs", str(cut)).load()
    got = [_utc_ms(r.store_ts) for r in later.select("store_ts").collect()]
    assert len(got) == sum(1 for s in stamps if s >= cut)
    assert min(got) >= cut
