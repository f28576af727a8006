"""A corrupt record in a broker's commit log under Spark's unchecked reads.

Spark's source asks the broker not to check records (`unchecked` PULLs) and
checks every one itself. A corrupt record must then cost nothing but that
record: the read goes on with the broker's check, which skips it, and every
other row comes back exactly once. The broker honours the flag only as a
boolean.
"""
from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from ferry import Message, Producer
from ferry.client.core.connection import BrokerConnection
from ferry.codec.record import check_records, iter_records
from ferry.errors import CorruptRecordError, MalformedRequestError
from ferry.wire import PullAnswer, PullRequest, PullStatus, RequestCode

from tests.client.conftest import BrokerProc, Mesh
from tests.spark.conftest import new_topic

pytestmark = [pytest.mark.slow, pytest.mark.integration]

MARK = b"corrupt-me-"
COUNT = 2500


def _body(i: int) -> bytes:
    return (MARK if i == COUNT // 2 else b"fine-") + b"%05d" % i


@pytest.fixture(scope="module")
def damaged(spark_mesh: Mesh) -> tuple[str, BrokerProc]:
    """A topic of one queue per broker whose record COUNT // 2 is damaged on disk."""
    topic = new_topic(spark_mesh, "spark-corrupt", queues=1)

    async def send() -> None:
        async with Producer(namesrv=spark_mesh.namesrv) as producer:
            for at in range(0, COUNT, 250):
                await producer.send_batch(topic, [Message(_body(i))
                                                  for i in range(at, min(COUNT, at + 250))])
    asyncio.run(send())
    for broker in spark_mesh.brokers.values():
        for seg in sorted((broker.data_dir / "commitlog").iterdir()):
            if _flip_after(seg, MARK + b"%05d" % (COUNT // 2)):
                return topic, broker
    raise AssertionError("the marked record is in no broker's commit log")


def _flip_after(path: Path, needle: bytes) -> bool:
    """Change the byte after `needle` in `path` (the body's last digit: inside the CRC);
    the broker maps the file shared, so it reads the change."""
    with open(path, "r+b") as f:
        data = f.read()
        at = data.find(needle)
        if at < 0:
            return False
        f.seek(at + len(needle) - 1)
        f.write(b"X")
    return True


def test_a_spark_read_skips_a_corrupt_record_and_returns_every_other(
        spark, spark_mesh: Mesh, damaged: tuple[str, BrokerProc]) -> None:
    topic, _ = damaged
    rows = spark.read.format("ferry").option("namesrv", spark_mesh.namesrv) \
        .option("topic", topic).load().select("body").collect()
    bodies = sorted(bytes(r.body) for r in rows)
    assert bodies == sorted(_body(i) for i in range(COUNT) if i != COUNT // 2)


async def _pull(broker: BrokerProc, topic: str, **extra: object) -> PullAnswer:
    conn = await BrokerConnection.open(broker.addr)
    try:
        fields = {**PullRequest("spark-corrupt-probe", topic, 0, 0, 1024).fields(), **extra}
        resp = await conn.request(RequestCode.PULL, fields)
        return PullAnswer.parse(resp.fields, resp.body, 0)
    finally:
        await conn.close()


def test_the_broker_serves_unchecked_records_only_when_asked(
        damaged: tuple[str, BrokerProc]) -> None:
    topic, broker = damaged
    raw = asyncio.run(_pull(broker, topic, unchecked=True))
    assert raw.status is PullStatus.FOUND
    body = memoryview(raw.body)
    with pytest.raises(CorruptRecordError):   # served as stored, for the reader to find
        check_records(body, 0, len(body))
    checked = asyncio.run(_pull(broker, topic))
    bodies = [m.body for m in iter_records(checked.body)]
    assert bodies and not any(b.startswith(MARK) for b in bodies)
    assert len(checked.body) < len(raw.body)    # the damaged record was left out
    with pytest.raises(MalformedRequestError, match="unchecked"):
        asyncio.run(_pull(broker, topic, unchecked="yes"))
    assert asyncio.run(_pull(broker, topic)).status is PullStatus.FOUND   # still serving
