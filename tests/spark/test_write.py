"""Writes: rows sent as messages (batch and stream), consumed back intact."""
from __future__ import annotations

import asyncio

import pytest
from pyspark.sql.types import BinaryType, MapType, StringType, StructField, StructType

from tests.client.conftest import Mesh
from tests.spark.conftest import consume_all, new_topic

pytestmark = [pytest.mark.slow, pytest.mark.integration]

ROWS = 1_200
ROW_SCHEMA = StructType([
    StructField("body", BinaryType()), StructField("key", StringType()),
    StructField("tags", StringType()),
    StructField("properties", MapType(StringType(), StringType()))])


def _row(i: int) -> tuple:
    return (f"row-{i}".encode() + b"\x00\xff", f"k{i} alt{i}" if i % 2 else None,
            f"t{i % 3}" if i % 4 else None, {"i": str(i)})


def _check_consumed(records: list, count: int) -> None:
    assert len(records) == count
    by_body = {r.body: r for r in records}
    assert len(by_body) == count
    for i in range(count):
        body, key, tags, props = _row(i)
        r = by_body[body]
        assert r.keys == (tuple(key.split()) if key else ())
        assert r.tags == tags
        assert r.properties["i"] == props["i"]


def test_batch_write_is_consumed_back_intact(spark, spark_mesh: Mesh) -> None:
    topic = new_topic(spark_mesh, "spark-write", queues=2)
    df = spark.createDataFrame([_row(i) for i in range(ROWS)], ROW_SCHEMA).repartition(3)
    df.write.format("ferry").option("namesrv", spark_mesh.namesrv).option("topic", topic) \
        .mode("append").save()
    _check_consumed(asyncio.run(consume_all(spark_mesh.namesrv, topic, ROWS)), ROWS)


def test_string_body_and_topic_column(spark, spark_mesh: Mesh) -> None:
    topics = [new_topic(spark_mesh, "spark-write-col", queues=1) for _ in range(2)]
    df = spark.createDataFrame([(topics[i % 2], f"text-{i}") for i in range(20)],
                               "topic string, body string")
    df.write.format("ferry").option("namesrv", spark_mesh.namesrv).mode("append").save()
    for n, topic in enumerate(topics):
        got = asyncio.run(consume_all(spark_mesh.namesrv, topic, 10))
        assert sorted(r.body for r in got) == sorted(f"text-{i}".encode()
                                                     for i in range(n, 20, 2))


def test_stream_write_is_consumed_back_intact(spark, spark_mesh: Mesh, tmp_path) -> None:
    """A topic copied into another by a streaming query (read stream -> write stream)."""
    source = new_topic(spark_mesh, "spark-wsrc", queues=2)
    target = new_topic(spark_mesh, "spark-wdst", queues=2)
    spark.createDataFrame([_row(i) for i in range(ROWS)], ROW_SCHEMA).write.format("ferry") \
        .option("namesrv", spark_mesh.namesrv).option("topic", source).mode("append").save()
    query = spark.readStream.format("ferry").option("namesrv", spark_mesh.namesrv) \
        .option("topic", source).option("startingOffsets", "earliest").load() \
        .writeStream.format("ferry").option("namesrv", spark_mesh.namesrv) \
        .option("topic", target).option("checkpointLocation", str(tmp_path / "ck")) \
        .trigger(availableNow=True).start()
    query.awaitTermination(120)
    assert query.exception() is None
    _check_consumed(asyncio.run(consume_all(spark_mesh.namesrv, target, ROWS)), ROWS)
