"""Writes as the producer makes them: keys keep their queue and order, and the send
options (delay, deliver-at, TTL, priority) as columns."""
from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest
from ferry import Admin, Producer

from tests.client.conftest import Mesh, unique
from tests.delay_scheduler.conftest import SchedulerProc, start_scheduler
from tests.spark.conftest import consume_all, new_topic

pytestmark = [pytest.mark.slow, pytest.mark.integration]

KEYS = 12
ROWS = 600


@pytest.fixture(scope="module")
def scheduler(spark_mesh: Mesh) -> Iterator[SchedulerProc]:
    """The delay-scheduler that delivers the delayed rows."""
    s = start_scheduler(spark_mesh, unique("sched"))
    yield s
    s.proc.stop()


def _write(df, namesrv: str, topic: str) -> None:
    df.write.format("ferry").option("namesrv", namesrv).option("topic", topic) \
        .mode("append").save()


async def _producer_queues(namesrv: str, topic: str, keys: list[str]) -> dict[str, tuple]:
    """Where the Producer itself puts an ordered message of each key."""
    async with Producer(namesrv=namesrv) as producer:
        out = {}
        for key in keys:
            r = await producer.send_and_wait(topic, b"probe", key=key, ordered=True)
            out[key] = (r.broker, r.queue_id)
        return out


def test_keyed_write_keeps_each_key_in_its_producer_queue_in_order(spark, spark_mesh: Mesh
                                                                    ) -> None:
    topic = new_topic(spark_mesh, "spark-wkey", queues=4)
    rows = [(i, f"k{i % KEYS}", f"{i % KEYS}:{i}") for i in range(ROWS)]
    # Spark's way to per-key order: a key's rows in one task, in sequence.
    df = spark.createDataFrame(rows, "seq long, key string, body string") \
        .repartition(3, "key").sortWithinPartitions("seq")
    _write(df, spark_mesh.namesrv, topic)
    got = asyncio.run(consume_all(spark_mesh.namesrv, topic, ROWS))
    expected = asyncio.run(_producer_queues(spark_mesh.namesrv, topic,
                                            [f"k{k}" for k in range(KEYS)]))
    assert len(set(expected.values())) > 1   # the keys spread over several queues
    by_key: dict[str, list] = {}
    for r in got:
        by_key.setdefault(r.key, []).append(r)
    assert sorted(by_key) == sorted(expected)
    for key, records in by_key.items():
        assert {(r.broker, r.queue_id) for r in records} == {expected[key]}, key
        records.sort(key=lambda r: r.queue_offset)
        seqs = [int(r.body.split(b":")[1]) for r in records]
        assert seqs == sorted(seqs) and len(seqs) == ROWS // KEYS, key


def test_send_option_columns(spark, spark_mesh: Mesh, scheduler: SchedulerProc) -> None:
    """delayMs and deliverAtMs hold rows back, ttlMs expires them, priority picks the level."""
    topic = unique("spark-wopt")

    async def create() -> None:
        async with Admin(namesrv=spark_mesh.namesrv) as admin:
            await admin.create_topic(topic, queues=4, priority_levels=2)
    asyncio.run(create())
    at_ms = int(time.time() * 1000) + 3_000
    rows = ([(f"hi-{i}", None, None, None, 3) for i in range(20)]
            + [(f"lo-{i}", None, None, None, 0) for i in range(20)]
            + [(f"delay-{i}", 2_000, None, None, None) for i in range(5)]
            + [(f"at-{i}", None, at_ms, None, None) for i in range(5)]
            + [(f"live-{i}", None, None, 600_000, None) for i in range(5)]
            + [(f"ttl-{i}", None, None, 1, None) for i in range(5)])
    df = spark.createDataFrame(rows, "body string, delayMs long, deliverAtMs long, ttlMs int, "
                                     "priority int")
    _write(df, spark_mesh.namesrv, topic)
    time.sleep(0.2)   # past the 1 ms TTL for certain
    expected = {b for b, *_ in rows if not b.startswith("ttl")}
    got = {r.body.decode(): r for r in asyncio.run(
        consume_all(spark_mesh.namesrv, topic, len(expected), timeout_s=60))}
    assert set(got) == expected   # no expired row, every other one
    # 4 queues, 2 levels: queues 0-1 serve level 0 (priorities 0, 1), 2-3 level 1 (2, 3).
    assert {got[f"hi-{i}"].queue_id for i in range(20)} <= {2, 3}
    assert {got[f"lo-{i}"].queue_id for i in range(20)} <= {0, 1}
    for i in range(5):
        d = got[f"delay-{i}"]
        assert d.store_ts_ms - d.born_ts_ms >= 2_000
        assert got[f"at-{i}"].store_ts_ms >= at_ms


def test_bad_priority_fails_the_write(spark, spark_mesh: Mesh) -> None:
    topic = new_topic(spark_mesh, "spark-wbad", queues=1)
    df = spark.createDataFrame([("x", 7)], "body string, priority int")
    with pytest.raises(Exception, match="a row has priority 7; expected 0..3"):
        _write(df, spark_mesh.namesrv, topic)


def test_option_column_of_wrong_type_is_refused(spark, spark_mesh: Mesh) -> None:
    topic = new_topic(spark_mesh, "spark-wbad", queues=1)
    df = spark.createDataFrame([("x", "soon")], "body string, delayMs string")
    with pytest.raises(Exception, match="column delayMs has type string"):
        _write(df, spark_mesh.namesrv, topic)
