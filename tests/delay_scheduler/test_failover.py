"""Losing a scheduler's machine (process AND data directory) loses no delayed message.

The brokers' %SCHEDULE% is the truth and the committed offset only a low-water
mark (docs/delay.md, "Failover"): a standby that takes over re-reads what was
not settled; a cancel is kept in etcd; a broker queue history replaced while
the scheduler was down is read again, never skipped.
"""
from __future__ import annotations

import asyncio
import shutil
import time

import pytest
from ferry.codec import DELIVER_AT_MS

from tests.client.conftest import Mesh, unique
from tests.delay_scheduler.conftest import (
    Collector,
    DelaySender,
    SchedulerProc,
    start_scheduler,
    until,
    wait_for,
)

pytestmark = pytest.mark.integration

# Short wheel (as test_integration.py) and small local segments: the suite stays fast.
FAST = {"FERRY_DELAY_SCHEDULER_BUCKET_MS": "3000", "FERRY_DELAY_SCHEDULER_WINDOW_MS": "3000",
        "FERRY_DELAY_SCHEDULER_PROGRESS_INTERVAL_MS": "200"}


def _now_ms() -> int:
    return int(time.time() * 1000)


def _leader(*scheds: SchedulerProc) -> SchedulerProc:
    for s in scheds:
        try:
            if s.stats()["role"] == "leader":
                return s
        except OSError:
            continue
    raise AssertionError("no leader")


def _pair(mesh: Mesh, env: dict[str, str] | None = None) -> tuple[SchedulerProc, SchedulerProc]:
    """Two instances on one mesh, once one leads and the other stands by."""
    first = start_scheduler(mesh, unique("sched"), env={**FAST, **(env or {})})
    second = start_scheduler(mesh, unique("sched"), env={**FAST, **(env or {})})
    wait_for(lambda: {first.stats()["role"], second.stats()["role"]}
             == {"leader", "standby"}, what="one leader, one standby")
    return first, second


def _lose_the_leader(mesh: Mesh, first: SchedulerProc, second: SchedulerProc) -> SchedulerProc:
    """kill -9 the leader and delete its data directory; the survivor, once it leads."""
    leader = _leader(first, second)
    survivor = second if leader is first else first
    leader.proc.kill9()
    shutil.rmtree(mesh.workdir / leader.name / "data")  # the machine's disk is gone
    wait_for(lambda: survivor.stats()["role"] == "leader", 30, "the standby takes over")
    return survivor


def _lateness(collector: Collector) -> list[int]:
    """Per arrival: store time - due (never negative when nothing is early)."""
    return sorted(rec.store_ts_ms - int(rec.properties[DELIVER_AT_MS])
                  for _, rec in collector.got)


def _p99(values: list[int]) -> int:
    return values[min(len(values) - 1, int(len(values) * 0.99))] if values else 0


@pytest.mark.slow
async def test_leader_machine_lost_with_50000_pending_loses_none(delay_mesh: Mesh) -> None:
    first, second = _pair(delay_mesh)
    topic = unique("failover")
    collector = Collector(delay_mesh.namesrv, topic)
    await collector.start()
    sender = DelaySender(delay_mesh.namesrv)
    n = 50_000
    try:
        start = _now_ms()
        ids = await sender.send(topic, [(b"f%d" % i, start + 2000 + (i * 58_000) // n)
                                        for i in range(n)], batch=1000)
        await asyncio.sleep(max(0.0, (start + 10_000 - _now_ms()) / 1000))
        killed_ms = _now_ms()
        survivor = _lose_the_leader(delay_mesh, first, second)
        print(f"\nfailover: standby leads {_now_ms() - killed_ms} ms after the kill")
        await collector.wait_count(n, 120)
        assert {r.msg_id for _, r in collector.got} == set(ids)
        lateness = _lateness(collector)
        assert lateness[0] >= 0, f"stored {-lateness[0]} ms early"
        print(f"delivered {n} (+{len(collector.got) - n} duplicates), lateness p99 "
              f"{_p99(lateness)} ms, max {lateness[-1]} ms")
        assert len(collector.got) - n <= survivor.stats()["duplicates_after_crash"]
    finally:
        await sender.close()
        await collector.stop()
        for s in (first, second):
            s.proc.stop()


async def test_a_cancel_survives_the_failover(delay_mesh: Mesh) -> None:
    first, second = _pair(delay_mesh)
    topic = unique("cancelfo")
    collector = Collector(delay_mesh.namesrv, topic)
    await collector.start()
    sender = DelaySender(delay_mesh.namesrv)
    try:
        due = _now_ms() + 9000
        keep, drop = await sender.send(topic, [(b"keep", due), (b"drop", due)])
        leader = _leader(first, second)
        wait_for(lambda: leader.stats()["taken"] >= 2, what="taken over")
        status, body = leader.post(f"/v1/delayed/{drop.hex()}/cancel")
        assert (status, body["cancelled"]) == (200, True)
        _lose_the_leader(delay_mesh, first, second)
        await collector.wait_count(1, 30)
        await asyncio.sleep(max(0.0, (due - _now_ms()) / 1000) + 2.0)  # room for a wrong one
        assert [r.msg_id for _, r in collector.got] == [keep]
    finally:
        await sender.close()
        await collector.stop()
        for s in (first, second):
            s.proc.stop()


async def test_rolled_messages_survive_the_loss_of_the_leader(delay_mesh: Mesh) -> None:
    # Rolled after 1 s: each pending copy is stored again in %SCHEDULE% while far from due.
    first, second = _pair(delay_mesh, {"FERRY_DELAY_SCHEDULER_ROLL_AFTER_MS": "1000"})
    topic = unique("rolled")
    collector = Collector(delay_mesh.namesrv, topic)
    await collector.start()
    sender = DelaySender(delay_mesh.namesrv)
    try:
        due = _now_ms() + 20_000
        ids = await sender.send(topic, [(b"r%d" % i, due) for i in range(20)])
        leader = _leader(first, second)
        wait_for(lambda: leader.stats()["rolled"] >= 20, 15, "every message rolled")
        wait_for(lambda: leader.stats()["pending"] == 20, 5, "a copy replaces its original")
        survivor = _lose_the_leader(delay_mesh, first, second)
        await collector.wait_count(len(ids), 40)
        await asyncio.sleep(1.0)  # room for a duplicate to show up
        assert {r.msg_id for _, r in collector.got} == set(ids)
        assert _lateness(collector)[0] >= 0
        # A copy rolled just before the loss may go out twice, but never uncounted.
        assert len(collector.got) - len(ids) <= survivor.stats()["duplicates_after_crash"]
    finally:
        await sender.close()
        await collector.stop()
        for s in (first, second):
            s.proc.stop()


async def test_a_replaced_broker_history_is_read_again_not_skipped(
        fresh_delay_mesh: Mesh) -> None:
    mesh = fresh_delay_mesh
    name = unique("sched")
    sched = start_scheduler(mesh, name, env=FAST)
    topic = unique("history")
    collector = Collector(mesh.namesrv, topic)
    await collector.start()
    sender = DelaySender(mesh.namesrv)
    try:
        wait_for(lambda: sched.stats()["role"] == "leader", what="leadership")
        before = await sender.send(topic, [(b"a%d" % i, _now_ms() + 500) for i in range(200)])
        await collector.wait_count(len(before), 30)
        await until(lambda: sched.stats()["pinned"] == 0, 10, "settled")
        await asyncio.sleep(1.0)  # the low-water marks are committed
        sched.proc.stop()  # the scheduler is down while the broker's history is replaced
        broker = mesh.brokers["broker-a"]
        broker.proc.kill9()
        shutil.rmtree(broker.data_dir)
        mesh.start_broker("broker-a")
        await collector.stop()
        collector = Collector(mesh.namesrv, topic)  # the topic's log was replaced as well
        await collector.start()
        # More than before, so that the new log grows past every offset saved before.
        after = await sender.send(topic, [(b"b%d" % i, _now_ms() + 1500) for i in range(600)])
        sched = start_scheduler(mesh, name, http_port=sched.http_port, env=FAST)
        await collector.wait_count(len(after), 60)
        assert {r.msg_id for _, r in collector.got} == set(after)
        assert _lateness(collector)[0] >= 0
    finally:
        await sender.close()
        await collector.stop()
        sched.proc.stop()
