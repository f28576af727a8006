"""Consumers read from the slave: while the master is down, and when the master suggests it.

- The master gets kill -9 while a consumer is part-way through a backlog; with
  a long lease (no election for a while) the consumer goes on from the slave,
  receives the whole backlog while the slave is still a slave, and its commits
  are stored there.
- A master whose consumer is far behind (`slave_read_lag_bytes` made tiny)
  answers with `suggest_slave`; the consumer then reads from the slave, gets
  everything exactly once, and goes back to the master once caught up.
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest
from ferry import Consumer, Message, Producer
from ferry.client.core.connection import BrokerConnection
from ferry.wire import RequestCode

from tests.replication.load import FAST_CONSUMER
from tests.support.ha import Cluster

pytestmark = [pytest.mark.integration, pytest.mark.slow]

BACKLOG = 2_000
LONG_TTL_S = 15   # no election during the test's reads


async def _backlog(namesrv: str, topic: str, n: int) -> None:
    async with Producer(namesrv=namesrv) as producer:
        for start in range(0, n, 100):
            await producer.send_batch(topic, [Message(f"m{i}".encode())
                                              for i in range(start, min(n, start + 100))])


async def _committed_at(addr: str, group: str, topic: str, queues: int) -> int:
    conn = await BrokerConnection.open(addr)
    try:
        total = 0
        for q in range(queues):
            resp = await conn.request(RequestCode.QUERY_OFFSET,
                                      {"group": group, "topic": topic, "queue_id": q})
            total += max(0, int(resp.fields.get("offset", -1)))
        return total
    finally:
        await conn.close()


async def _stored(addr: str, topic: str, queues: int) -> int:
    conn = await BrokerConnection.open(addr)
    try:
        total = 0
        for q in range(queues):
            resp = await conn.request(RequestCode.GET_MIN_MAX, {"topic": topic, "queue_id": q})
            total += int(resp.fields["max_offset"]) - int(resp.fields["min_offset"])
        return total
    finally:
        await conn.close()


async def test_reads_continue_from_the_slave_while_the_master_is_down(
        clusters: Callable[..., Cluster]) -> None:
    cluster = clusters(replication="sync", election_ttl_s=LONG_TTL_S)
    master, _ = cluster.wait_master("broker-a")
    slave = next(b for b in cluster.brokers.values() if b is not master)
    topic, group = "ha-reads", "g-reads"
    await _backlog(cluster.namesrv, topic, BACKLOG)   # sync: every acked record is on the slave
    got: list[bytes] = []
    async with Consumer(topic, group=group, namesrv=cluster.namesrv, pull_batch_size=16,
                        prefetch_records_per_queue=16, **FAST_CONSUMER) as consumer:
        while len(got) < 100:
            for records in (await consumer.getmany(timeout_ms=1000)).values():
                got += [r.body for r in records]
        master.kill9()
        killed = time.monotonic()
        deadline = killed + LONG_TTL_S - 2
        while len(set(got)) < BACKLOG and time.monotonic() < deadline:
            for records in (await consumer.getmany(timeout_ms=500)).values():
                got += [r.body for r in records]
        done = time.monotonic()
        roles = {x["addr"]: x.get("role") for x in cluster.listed()}
        sources = {q["reading_from"] for q in consumer.describe()["queues"].values()}
        await consumer.commit()
    assert set(got) == {f"m{i}".encode() for i in range(BACKLOG)}
    assert done - killed < LONG_TTL_S - 1 and roles.get(slave.addr) == "slave", roles
    assert sources == {slave.addr}
    assert await _committed_at(slave.addr, group, topic, 4) == BACKLOG


async def test_suggest_slave_moves_reads_to_the_slave_and_back(
        clusters: Callable[..., Cluster]) -> None:
    cluster = clusters(replication="sync",
                       broker_env={"FERRY_BROKER_SLAVE_READ_LAG_BYTES": "4096"})
    master, _ = cluster.wait_master("broker-a")
    slave = next(b for b in cluster.brokers.values() if b is not master)
    topic = "ha-suggest"
    await _backlog(cluster.namesrv, topic, BACKLOG)
    got: list[bytes] = []
    sources: set[str | None] = set()
    async with Consumer(topic, group="g-suggest", namesrv=cluster.namesrv, pull_batch_size=32,
                        **FAST_CONSUMER) as consumer:
        deadline = time.monotonic() + 30
        while len(got) < BACKLOG and time.monotonic() < deadline:
            for records in (await consumer.getmany(timeout_ms=500)).values():
                got += [r.body for r in records]
            sources |= {q["reading_from"] for q in consumer.describe()["queues"].values()}
        # caught up: the slave has nothing newer, so each queue asks the master again
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            now = {q["reading_from"] for q in consumer.describe()["queues"].values()}
            if now == {master.addr}:
                break
            await asyncio.sleep(0.2)
    assert set(got) == {f"m{i}".encode() for i in range(BACKLOG)}
    assert len(got) == await _stored(master.addr, topic, 4)   # each stored record once
    assert slave.addr in sources
    assert now == {master.addr}
