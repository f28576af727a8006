"""Bad input: unknown topics, an unreachable namesrv, offsets out of range, bad options."""
from __future__ import annotations

import asyncio
import json

import pytest
from ferry.codec.limits import MAX_BODY_BYTES

from tests.client.conftest import Mesh, unique
from tests.spark.conftest import new_topic, send_messages
from tests.support.procs import free_port

pytestmark = [pytest.mark.slow, pytest.mark.integration]


def _read(spark, mesh: Mesh, topic: str, **options: str):
    reader = spark.read.format("ferry").option("namesrv", mesh.namesrv).option("topic", topic)
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load()


@pytest.fixture(scope="module")
def small(spark_mesh: Mesh) -> str:
    """A topic of one queue per broker holding 10 messages."""
    topic = new_topic(spark_mesh, "spark-err", queues=1)
    asyncio.run(send_messages(spark_mesh.namesrv, topic, range(10)))
    return topic


def test_unknown_topic(spark, spark_mesh: Mesh) -> None:
    name = unique("nope")
    with pytest.raises(Exception, match=f"topic '{name}' does not exist"):
        _read(spark, spark_mesh, name).collect()


def test_unreachable_namesrv(spark) -> None:
    addr = f"127.0.0.1:{free_port()}"
    df = spark.read.format("ferry").option("namesrv", addr).option("topic", "t").load()
    with pytest.raises(Exception, match=f"cannot reach namesrv {addr}"):
        df.collect()


def test_offsets_out_of_range_fail_or_clamp(spark, spark_mesh: Mesh, small: str) -> None:
    counts = {r.broker: r["count"] for r in
              _read(spark, spark_mesh, small).groupBy("broker").count().collect()}
    broker = sorted(counts)[0]
    ending = json.dumps({broker: {"0": 10_000}})
    with pytest.raises(Exception, match=rf"ending offset 10000 of {small} {broker}/0 is out "
                                        rf"of range: the queue holds \[0, {counts[broker]}\)"):
        _read(spark, spark_mesh, small, endingOffsets=ending).collect()
    clamped = _read(spark, spark_mesh, small, endingOffsets=ending, offsetOutOfRange="clamp")
    assert clamped.count() == 10


# Each case here is one planning round trip through Spark (seconds); the option rules
# themselves are tested without Spark in test_ranges.py.
@pytest.mark.parametrize(("options", "match"), [
    ({"offsetOutOfRange": "ignore"}, "offsetOutOfRange must be fail or clamp"),
    ({"startingOffset": "earliest"}, "unknown option"),
])
def test_bad_read_options(spark, spark_mesh: Mesh, small: str, options: dict, match: str) -> None:
    with pytest.raises(Exception, match=match):
        _read(spark, spark_mesh, small, **options)   # load() itself fails


def test_missing_topic_option(spark, spark_mesh: Mesh) -> None:
    with pytest.raises(Exception, match="option topic is required"):
        spark.read.format("ferry").option("namesrv", spark_mesh.namesrv).load()


def test_write_needs_a_body_column(spark, spark_mesh: Mesh, small: str) -> None:
    df = spark.createDataFrame([("x",)], "text string")
    with pytest.raises(Exception, match="needs a body column"):
        df.write.format("ferry").option("namesrv", spark_mesh.namesrv) \
            .option("topic", small).mode("append").save()


def test_stream_of_unknown_topic_fails_the_query(spark, spark_mesh: Mesh, tmp_path) -> None:
    name = unique("nope")
    query = spark.readStream.format("ferry").option("namesrv", spark_mesh.namesrv) \
        .option("topic", name).load().writeStream.format("noop") \
        .option("checkpointLocation", str(tmp_path / "ck")).start()
    with pytest.raises(Exception, match=f"topic '{name}' does not exist"):
        query.awaitTermination(60)
    query.stop()


def test_failed_send_fails_the_write(spark, spark_mesh: Mesh, small: str) -> None:
    too_big = bytes(MAX_BODY_BYTES + 1)
    df = spark.createDataFrame([(too_big,)], "body binary")
    with pytest.raises(Exception, match="MessageTooLargeError"):
        df.write.format("ferry").option("namesrv", spark_mesh.namesrv) \
            .option("topic", small).mode("append").save()
