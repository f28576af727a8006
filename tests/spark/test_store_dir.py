"""The offline read: a copy of a broker's data directory, read through ferry.store."""
from __future__ import annotations

import asyncio
import shutil
import subprocess

import pytest
from ferry_spark import SCHEMA

from tests.client.conftest import Mesh
from tests.spark.conftest import message, new_topic, send_messages

pytestmark = [pytest.mark.slow, pytest.mark.integration]

COUNT = 1_000


def _copy_dir(src, dst) -> None:
    # Segments are preallocated sparse files: copy them sparse, not 64 MiB each.
    subprocess.run(["cp", "-r", "--sparse=always", str(src), str(dst)], check=True)


def test_store_dir_read_matches_the_network_read(spark, spark_mesh: Mesh, tmp_path) -> None:
    topic = new_topic(spark_mesh, "spark-store", queues=4)
    sent = asyncio.run(send_messages(spark_mesh.namesrv, topic, range(COUNT)))
    broker = spark_mesh.brokers["broker-a"]
    copy = tmp_path / "broker-a"
    _copy_dir(broker.data_dir, copy)
    try:
        df = spark.read.format("ferry").option("topic", topic).load(str(copy))
        assert df.schema == SCHEMA
        rows = df.collect()
        want = {s.msg_id: (i, s) for i, s in enumerate(sent) if s.broker == "broker-a"}
        assert 0 < len(want) < COUNT
        assert len(rows) == len(want) == len({r.msg_id for r in rows})
        for r in rows:
            i, s = want[r.msg_id]
            assert (r.broker, r.queue_id, r.queue_offset) == (s.broker, s.queue_id,
                                                              s.queue_offset)
            assert bytes(r.body) == message(i).body and r.tags == message(i).tags
        network = spark.read.format("ferry").option("namesrv", spark_mesh.namesrv) \
            .option("topic", topic).load().where("broker = 'broker-a'")
        assert sorted(map(tuple, network.collect())) == sorted(map(tuple, rows))
        # the broker column can be named; offsets work as over the network
        named = spark.read.format("ferry").option("storeDir", str(copy)) \
            .option("broker", "copy-of-a").option("topic", topic) \
            .option("startingOffsets", '{"copy-of-a": {"0": 5}}').load()
        got = named.where("queue_id = 0").select("broker", "queue_offset").collect()
        assert {r.broker for r in got} == {"copy-of-a"}
        assert min(r.queue_offset for r in got) == 5
    finally:
        shutil.rmtree(copy, ignore_errors=True)


def test_store_dir_of_a_running_broker_is_refused(spark, spark_mesh: Mesh) -> None:
    topic = new_topic(spark_mesh, "spark-store-live", queues=1)
    asyncio.run(send_messages(spark_mesh.namesrv, topic, range(3)))
    live = spark_mesh.brokers["broker-a"].data_dir
    with pytest.raises(Exception, match="in use"):
        spark.read.format("ferry").option("topic", topic).load(str(live)).collect()


def test_store_dir_that_is_no_store(spark, tmp_path) -> None:
    with pytest.raises(Exception, match="not a broker data directory"):
        spark.read.format("ferry").option("topic", "t").load(str(tmp_path)).collect()
