"""An empty topic (or an empty range of a full one) reads as an empty DataFrame, batch and
stream: planning finds no range, and the one task Spark runs anyway reads nothing."""
from __future__ import annotations

import asyncio

import pytest
from ferry_spark import SCHEMA

from tests.client.conftest import Mesh
from tests.spark.conftest import new_topic, send_messages

pytestmark = [pytest.mark.slow, pytest.mark.integration]


def _read(spark, mesh: Mesh, topic: str, **options: str):
    reader = spark.read.format("ferry").option("namesrv", mesh.namesrv).option("topic", topic)
    for name, value in options.items():
        reader = reader.option(name, value)
    return reader.load()


def test_empty_topic_reads_as_empty_dataframe(spark, spark_mesh: Mesh) -> None:
    topic = new_topic(spark_mesh, "spark-empty", queues=2)
    df = _read(spark, spark_mesh, topic)
    assert df.schema == SCHEMA
    assert df.collect() == []
    assert df.count() == 0
    assert df.groupBy("queue_id").count().collect() == []


def test_empty_range_of_a_full_topic_reads_nothing(spark, spark_mesh: Mesh) -> None:
    topic = new_topic(spark_mesh, "spark-empty-range", queues=2)
    asyncio.run(send_messages(spark_mesh.namesrv, topic, range(20)))
    assert _read(spark, spark_mesh, topic, startingOffsets="latest").collect() == []
    assert _read(spark, spark_mesh, topic).count() == 20


def test_stream_of_empty_topic_reads_nothing(spark, spark_mesh: Mesh, tmp_path) -> None:
    topic = new_topic(spark_mesh, "spark-empty-stream", queues=2)
    stream = spark.readStream.format("ferry").option("namesrv", spark_mesh.namesrv) \
        .option("topic", topic).option("startingOffsets", "earliest").load()
    out = tmp_path / "out"
    query = stream.writeStream.format("parquet").option("path", str(out)) \
        .option("checkpointLocation", str(tmp_path / "ckpt")).trigger(availableNow=True).start()
    query.awaitTermination(120)
    assert query.exception() is None
    assert sum(p["numInputRows"] for p in query.recentProgress) == 0
    assert spark.read.schema(SCHEMA).parquet(str(out)).count() == 0
