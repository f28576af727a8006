"""After a failover every group resumes where it committed (issue 24), on real processes.

A group broker-a of a master and a slave (sync). Groups commit offsets for many
queues at the master: a table whose single snapshot (the file format, which the
master sent before issue 24) exceeds the 16 MiB frame limit, so the old master
sent nothing more once the table grew past it. Then a consumer group commits
its positions; once the slave reports them (or a deadline passes) the master
gets kill -9. The slave takes over: every committed offset is there, and a
consumer of that group resumes exactly at its committed offsets.
"""
from __future__ import annotations

import asyncio
import json
import random
import time
import urllib.request
from typing import Any

import pytest
from ferry import Admin, Consumer
from ferry.client.core.connection import BrokerConnection
from ferry.wire import RequestCode
from ferry_broker.offsets_codec import Entry, encode_file
from ferry_broker.replication import protocol as p

from tests.broker.wire_client import encode_messages, message
from tests.support.ha import Cluster, HaBroker

pytestmark = [pytest.mark.integration, pytest.mark.slow]

GROUPS = 1000               # bulk groups, names of 127 characters
TOPICS = 56                 # bulk topics, one queue each, names of 127 characters
MESSAGES = 20               # per bulk queue
RESUME_TOPIC, RESUME_GROUP, RESUME_QUEUES = "resume", "resume-g", 4
RESUME_AT = {0: 7, 1: 0, 2: 19, 3: 30}   # committed offsets of the resuming group
REPLICATED_WAIT_S = 60.0    # for the slave to report the last commits (a hang, not a target)
PIPELINE = 256              # commits in flight on one connection


def bulk_names() -> tuple[list[str], list[str]]:
    return ([f"g{i:04d}-" + "x" * 121 for i in range(GROUPS)],
            [f"t{j:03d}-" + "y" * 122 for j in range(TOPICS)])


async def commit_all(conn: BrokerConnection, table: dict[tuple[str, str, int], Entry]) -> None:
    items = list(table.items())
    for start in range(0, len(items), PIPELINE):
        await asyncio.gather(*(
            conn.request(RequestCode.COMMIT_OFFSET, {
                "group": g, "topic": t, "queue_id": q, "offset": e.offset,
                **({"hist": e.hist} if e.hist is not None else {})})
            for (g, t, q), e in items[start:start + PIPELINE]))


async def query(conn: BrokerConnection, key: tuple[str, str, int]) -> tuple[int, str | None]:
    g, t, q = key
    resp = await conn.request(RequestCode.QUERY_OFFSET, {"group": g, "topic": t, "queue_id": q})
    return int(resp.fields["offset"]), resp.fields.get("hist")


async def wait_replicated(slave: HaBroker, keys: dict[tuple[str, str, int], int]) -> bool:
    """Until the slave answers every key's offset; False after REPLICATED_WAIT_S."""
    conn = await BrokerConnection.open(slave.addr)
    try:
        deadline = time.monotonic() + REPLICATED_WAIT_S
        while time.monotonic() < deadline:
            got = {key: (await query(conn, key))[0] for key in keys}
            if got == keys:
                return True
            await asyncio.sleep(0.2)
        return False
    finally:
        await conn.close()


def committed_in_stats(b: HaBroker) -> dict[tuple[str, str, int], int]:
    with urllib.request.urlopen(f"http://127.0.0.1:{b.http_port}/v1/stats", timeout=30) as r:
        groups = json.loads(r.read())["groups"]
    return {(g, t, int(q)): int(v["committed_offset"])
            for g, topics in groups.items() for t, queues in topics.items()
            for q, v in queues.items()}


async def first_offsets(cluster: Cluster) -> dict[int, int]:
    """Where a new member of RESUME_GROUP starts reading, per queue."""
    seen: dict[int, int] = {}
    async with Consumer(RESUME_TOPIC, group=RESUME_GROUP, namesrv=cluster.namesrv,
                        enable_auto_commit=False, auto_offset_reset="earliest",
                        heartbeat_interval_ms=500, rebalance_interval_ms=500,
                        pull_max_wait_ms=1_000, request_timeout_ms=5_000) as consumer:
        deadline = time.monotonic() + 60
        while len(seen) < RESUME_QUEUES and time.monotonic() < deadline:
            for tq, records in (await consumer.getmany(timeout_ms=1_000)).items():
                seen.setdefault(tq.queue_id, records[0].queue_offset)
    return seen


async def test_offsets_after_failover_are_the_ones_committed_before(
        clusters: Any) -> None:
    cluster: Cluster = clusters(replication="sync",
                                broker_env={"FERRY_BROKER_DEFAULT_QUEUES": "1"})
    master, epoch = cluster.wait_master("broker-a")
    slave = next(b for b in cluster.brokers.values() if b.addr != master.addr)
    async with Admin(namesrv=cluster.namesrv) as admin:
        await admin.create_topic(RESUME_TOPIC, queues=RESUME_QUEUES)
    groups, topics = bulk_names()
    rng = random.Random(24)
    table = {(g, t, 0): Entry(rng.randint(0, MESSAGES), rng.randbytes(16).hex(), None, 0)
             for g in groups for t in topics}
    assert len(encode_file(table)) > p.MAX_FRAME_BYTES   # the old single snapshot: not sent
    resume = {(RESUME_GROUP, RESUME_TOPIC, q): Entry(at, None, None, 0)
              for q, at in RESUME_AT.items()}

    conn = await BrokerConnection.open(master.addr, request_timeout_ms=60_000)
    try:
        for topic in topics:
            await conn.request(RequestCode.SEND, {"topic": topic, "queue_id": 0},
                               encode_messages([message(b"m")] * MESSAGES))
        for q in range(RESUME_QUEUES):   # the configured topic may take a moment to reach it
            for _ in range(100):
                try:
                    await conn.request(RequestCode.SEND, {"topic": RESUME_TOPIC, "queue_id": q},
                                       encode_messages([message(b"r")] * 40))
                    break
                except Exception:
                    await asyncio.sleep(0.1)
        await commit_all(conn, table)
        await commit_all(conn, resume)   # last: after the table passed 16 MiB
    finally:
        await conn.close()

    replicated = await wait_replicated(slave, {k: e.offset for k, e in resume.items()})
    master.kill9()
    new, _ = await asyncio.to_thread(cluster.wait_master, "broker-a", not_addr=master.addr,
                                     min_epoch=epoch + 1)
    assert new.addr == slave.addr
    assert replicated, "the slave never had the last commits before the kill"

    stats = committed_in_stats(new)
    assert {k: stats.get(k) for k in table} == {k: e.offset for k, e in table.items()}
    conn = await BrokerConnection.open(new.addr)
    try:
        for key in rng.sample(sorted(table), 200):
            assert await query(conn, key) == (table[key].offset, table[key].hist)
    finally:
        await conn.close()
    assert await first_offsets(cluster) == RESUME_AT
