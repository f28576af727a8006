"""Reads as Kafka's source takes them: topic lists and patterns, broker-side filters
(`filter` and pushed-down `df.filter`), a group that follows a stream, `minPartitions`."""
from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from pyspark.sql import functions as F

from tests.client.conftest import Mesh, unique
from tests.spark.conftest import message, new_topic, send_messages

pytestmark = [pytest.mark.slow, pytest.mark.integration]

PER_TOPIC = 120


def _read(spark, mesh: Mesh, **options: str):
    reader = spark.read.format("ferry").option("namesrv", mesh.namesrv)
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load()


def _filters(mesh: Mesh) -> list[dict]:
    """Every broker's /v1/stats `filters`, together."""
    out = []
    for broker in mesh.brokers.values():
        with urllib.request.urlopen(f"http://127.0.0.1:{broker.http_port}/v1/stats",
                                    timeout=10) as resp:
            out += json.loads(resp.read())["filters"]
    return out


def _bodies(df) -> list[bytes]:
    return sorted(bytes(r.body) for r in df.select("body").collect())


def _expected(numbers: range, keep=lambda m: True) -> list[bytes]:
    return sorted(message(i).body for i in numbers if keep(message(i)))


@pytest.fixture(scope="module")
def three(spark_mesh: Mesh) -> tuple[str, list[str], str]:
    """Three topics of one prefix, filled, and one other topic that a pattern must not match."""
    prefix = unique("spark-pat").replace("-", "_")
    topics = [new_topic(spark_mesh, f"{prefix}-{n}", queues=2) for n in range(3)]
    other = new_topic(spark_mesh, f"x{prefix}", queues=1)
    for topic in [*topics, other]:
        asyncio.run(send_messages(spark_mesh.namesrv, topic, range(PER_TOPIC)))
    return prefix, topics, other


def test_topic_pattern_reads_every_matching_topic(spark, spark_mesh: Mesh, three) -> None:
    prefix, topics, _ = three
    df = _read(spark, spark_mesh, topicPattern=f"{prefix}-.*")
    counts = {r["topic"]: r["count"] for r in df.groupBy("topic").count().collect()}
    assert counts == {t: PER_TOPIC for t in topics}   # the other topic is not read


def test_topic_list(spark, spark_mesh: Mesh, three) -> None:
    _, topics, other = three
    df = _read(spark, spark_mesh, topic=f"{topics[0]}, {other}")
    counts = {r["topic"]: r["count"] for r in df.groupBy("topic").count().collect()}
    assert counts == {topics[0]: PER_TOPIC, other: PER_TOPIC}


def test_tag_filter_is_pulled_with_and_exact(spark, spark_mesh: Mesh, three) -> None:
    _, topics, _ = three
    df = _read(spark, spark_mesh, topic=topics[1], filter="t1 || t3")
    assert _bodies(df) == _expected(range(PER_TOPIC), lambda m: m.tags in ("t1", "t3"))
    assert any(f["tags"] == ["t1", "t3"] and f["sql"] is None and f["pulls"] > 0
               for f in _filters(spark_mesh))


def test_sql_filter(spark, spark_mesh: Mesh, three) -> None:
    _, topics, _ = three
    sql = "n IS NOT NULL AND n > 100"   # the message's property n (rows 101..119 but 7s)
    df = _read(spark, spark_mesh, topic=topics[2], filter=sql, filterType="SQL92")
    assert _bodies(df) == _expected(range(PER_TOPIC), lambda m: int(m.properties.get("n", 0))
                                    > 100)
    assert any(f["sql"] == sql and f["pulls"] > 0 for f in _filters(spark_mesh))


def test_df_filter_on_tags_is_pushed_to_the_broker(spark, spark_mesh: Mesh, three) -> None:
    _, topics, _ = three
    df = _read(spark, spark_mesh, topic=topics[0], pushDownPredicate="true") \
        .filter(F.col("tags").isin("t0", "t2"))   # no message has t0 or t2: i % 2 == 1 tags
    df2 = _read(spark, spark_mesh, topic=topics[0], pushDownPredicate="true") \
        .filter((F.col("tags") == "t3") & (F.col("queue_offset") >= 0))
    spark.conf.set("spark.sql.python.filterPushdown.enabled", "true")
    try:
        assert df.count() == 0
        assert _bodies(df2) == _expected(range(PER_TOPIC), lambda m: m.tags == "t3")
    finally:
        spark.conf.unset("spark.sql.python.filterPushdown.enabled")
    pushed = {(tuple(f["tags"] or ()), f["sql"]) for f in _filters(spark_mesh)}
    assert (("t0", "t2"), None) in pushed and (("t3",), None) in pushed


def test_pushdown_needs_spark_conf(spark, spark_mesh: Mesh, three) -> None:
    _, topics, _ = three
    df = _read(spark, spark_mesh, topic=topics[0], pushDownPredicate="true") \
        .filter(F.col("tags") == "t1")
    with pytest.raises(Exception, match="spark.sql.python.filterPushdown.enabled"):
        df.count()


def test_min_partitions_splits_queue_ranges(spark, spark_mesh: Mesh, three) -> None:
    _, topics, _ = three
    plain = _read(spark, spark_mesh, topic=topics[0])
    split = _read(spark, spark_mesh, topic=topics[0], minPartitions="12")
    queues = plain.select("broker", "queue_id").distinct().count()
    assert plain.rdd.getNumPartitions() == queues < 12   # one partition per queue with data
    assert split.rdd.getNumPartitions() >= 12
    rows = split.select("broker", "queue_id", "queue_offset").collect()
    assert len(rows) == len(set(rows)) == PER_TOPIC


def _lag(mesh: Mesh, group: str, topics: list[str]) -> list[list[str]]:
    argv = [sys.executable, "-m", "ferry.cli.main", "--namesrv", mesh.namesrv, "group", "lag",
            group, *[a for t in topics for a in ("--topic", t)]]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=True).stdout
    return [line.split("\t") for line in out.splitlines()[1:-1]]


def test_group_follows_a_stream(spark, spark_mesh: Mesh, tmp_path: Path) -> None:
    """groupId: the committed offsets are the stream's progress (`ferry group lag` shows it)."""
    prefix = unique("spark-grp").replace("-", "_")
    topics = [new_topic(spark_mesh, f"{prefix}-{n}", queues=2) for n in range(2)]
    for topic in topics:
        asyncio.run(send_messages(spark_mesh.namesrv, topic, range(50)))
    group = unique("spark-g")
    before = _lag(spark_mesh, group, topics)
    assert before and all(row[3] == "-1" for row in before)   # never committed
    query = spark.readStream.format("ferry").option("namesrv", spark_mesh.namesrv) \
        .option("topicPattern", f"{prefix}-.*").option("startingOffsets", "earliest") \
        .option("groupId", group).option("maxOffsetsPerTrigger", "30").load() \
        .writeStream.format("noop").option("checkpointLocation", str(tmp_path / "ck")) \
        .trigger(availableNow=True).start()
    query.awaitTermination(180)
    assert query.exception() is None
    assert len(query.recentProgress) > 1   # several batches, each committed in turn
    after = _lag(spark_mesh, group, topics)
    assert {row[0] for row in after} == set(topics)
    assert all(row[3] == row[4] and row[5] == "0" for row in after), after
    assert sum(int(row[3]) for row in after) == 100
