"""Failover with async replication under load: the consumers skip nothing the new master
acknowledged (issue 16).

A master and a slave in async mode; eight keys sent in order, two members of a
group read all along. The master gets kill -9: the slave, whose log may lack
the master's last records (async), takes over with a new epoch and writes
where its own log ends. A consumer that had read past that point pulls with
the history (epoch) of its last record and is sent back to where the logs part,
so every message the new master acknowledged is delivered.
"""
from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable

import pytest

from tests.replication.load import KeyedLoad, Reader, verdict
from tests.support.ha import Cluster

pytestmark = [pytest.mark.integration, pytest.mark.slow]

LOAD_BEFORE_S = 2.0
LOAD_AFTER_S = 2.5
DRAIN_S = 30.0


async def test_async_failover_delivers_everything_the_new_master_acknowledged(
        clusters: Callable[..., Cluster]) -> None:
    cluster = clusters(replication="async")
    topic = "ha-history"
    old, old_epoch = cluster.wait_master("broker-a")
    load = KeyedLoad(cluster.namesrv, topic)
    readers = [Reader(cluster.namesrv, topic, group="g-ha-history") for _ in range(2)]
    await load.start()
    for r in readers:
        await r.start(auto_offset_reset="earliest")
    try:
        await asyncio.sleep(LOAD_BEFORE_S)
        old.kill9()
        killed = time.monotonic()
        new, new_epoch = await asyncio.to_thread(cluster.wait_master, "broker-a",
                                                 not_addr=old.addr, min_epoch=old_epoch + 1)
        elected = time.monotonic()
        await asyncio.sleep(LOAD_AFTER_S)
    finally:
        await load.stop()
    # Acked after the election: only the new master could have acknowledged them.
    after = {m for m, at in load.acked.items() if at > elected}
    delivered: list[tuple[str, int]] = []
    deadline = time.monotonic() + DRAIN_S
    while time.monotonic() < deadline:
        delivered = [d for r in readers for d in r.delivered]
        if after <= set(delivered):
            break
        await asyncio.sleep(0.2)
    rewinds = sum(r.consumer.describe()["history_rewinds"] for r in readers if r.consumer)
    for r in readers:
        await r.stop()
    v = verdict(after, delivered)
    before_lost = len(verdict({m for m, at in load.acked.items() if at < killed},
                              delivered).lost)
    print(json.dumps({"mode": "async", "new_epoch": new_epoch, "acked_after_election": len(after),
                      "delivered": v.delivered, "duplicates": v.duplicates,
                      "skipped": len(v.lost), "lost_before_kill_async_price": before_lost,
                      "history_rewinds": rewinds, "stats": new.get_json("/v1/stats")["histories"]}))
    assert after and v.lost == []
