"""A consumer never skips what was acknowledged when a queue's history is replaced (issue 16).

Real namesrv and broker processes. Producers send keyed messages with sequence
numbers (one queue per key, each key in order, retrying a failed send), a
two-member group reads; a broker is killed with SIGKILL, its data directory
removed, and started again empty. Every message the restarted broker
acknowledged must be delivered, first deliveries in per-key order. Each test
prints delivered, duplicates and skipped.
"""
from __future__ import annotations

import asyncio
import contextlib
import shutil
from collections import defaultdict
from dataclasses import dataclass, field

import pytest
from ferry import Admin, Consumer, Producer, TopicQueue
from ferry.errors import AlreadyExistsError, FerryError
from ferry.wire import RequestCode

from tests.broker.wire_client import WireClient, message
from tests.client.conftest import FAST_EXPIRY_ENV, Mesh, start_mesh, unique
from tests.client.util import FAST, send_all, wait_assignment
from tests.support.procs import Etcd

pytestmark = pytest.mark.integration

KEYS = 6
SEND_PAUSE_S = 0.01
DRAIN_TIMEOUT_S = 40.0


@dataclass
class Traffic:
    """What the producers had acknowledged, by generation, and what the consumers got."""

    generation: int = 0
    acked: dict[int, set[tuple[str, int]]] = field(default_factory=lambda: defaultdict(set))
    deliveries: list[tuple[str, int]] = field(default_factory=list)
    stop: asyncio.Event = field(default_factory=asyncio.Event)

    def report(self, generation: int, label: str) -> tuple[set[tuple[str, int]], int]:
        want = self.acked[generation]
        got = set(self.deliveries)
        skipped = want - got
        dups = len(self.deliveries) - len(got)
        print(f"{label}: acknowledged={len(want)} delivered={len(want & got)} "
              f"duplicates={dups} skipped={len(skipped)}")
        return skipped, dups

    def first_deliveries_in_key_order(self, generation: int) -> bool:
        want = self.acked[generation]
        seen: set[tuple[str, int]] = set()
        last: dict[str, int] = {}
        for item in self.deliveries:
            if item in seen or item not in want:
                continue
            seen.add(item)
            key, seq = item
            if seq < last.get(key, -1):
                print(f"out of order: {key} {seq} after {last[key]}")
                return False
            last[key] = seq
        return True


async def _produce(mesh: Mesh, topic: str, key: str, traffic: Traffic) -> None:
    """Send `key`'s messages in sequence until told to stop; a failed send is sent again."""
    async with Producer(namesrv=mesh.namesrv, request_timeout_ms=3000,
                        broker_backoff_ms=500) as producer:
        seq = 0
        while not traffic.stop.is_set():
            try:
                await producer.send_and_wait(topic, f"{key}:{seq}".encode(), key=key,
                                             ordered=True)
            except FerryError:
                await asyncio.sleep(0.2)
                continue
            traffic.acked[traffic.generation].add((key, seq))
            seq += 1
            await asyncio.sleep(SEND_PAUSE_S)


async def _read(consumers: list[Consumer], traffic: Traffic, done: asyncio.Event) -> None:
    while not done.is_set():
        for c in consumers:
            for records in (await c.getmany(timeout_ms=20)).values():
                for r in records:
                    key, seq = r.body.decode().split(":")
                    traffic.deliveries.append((key, int(seq)))


async def _drain(traffic: Traffic, generation: int) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + DRAIN_TIMEOUT_S
    while loop.time() < deadline and not traffic.acked[generation] <= set(traffic.deliveries):
        await asyncio.sleep(0.2)


def _lose_disk(mesh: Mesh, name: str, traffic: Traffic) -> None:
    broker = mesh.brokers[name]
    broker.proc.kill9()
    shutil.rmtree(broker.data_dir)


def _members(mesh: Mesh, topic: str, group: str) -> list[Consumer]:
    return [Consumer(topic, group=group, namesrv=mesh.namesrv, auto_offset_reset="latest",
                     **FAST) for _ in range(2)]


@pytest.fixture
def one_broker(etcd: Etcd, tmp_path):  # type: ignore[no-untyped-def]
    m = start_mesh(etcd, tmp_path / "mesh", ("broker-a",), broker_env=FAST_EXPIRY_ENV)
    yield m
    m.stop()


async def _queues(mesh: Mesh, topic: str) -> set[TopicQueue]:
    async with Admin(namesrv=mesh.namesrv) as admin:
        return {i.tq for i in await admin.queue_infos(topic)}


async def _start(mesh: Mesh, topic: str, group: str) -> list[Consumer]:
    consumers = _members(mesh, topic, group)
    for c in consumers:
        await c.start()
    await wait_assignment(consumers, await _queues(mesh, topic))
    return consumers


async def test_lost_disk_under_live_consumers_skips_nothing(one_broker: Mesh) -> None:
    mesh, topic, group = one_broker, unique("hist"), unique("g")
    traffic = Traffic()
    async with Producer(namesrv=mesh.namesrv) as p:   # the topic exists before the group
        await p.send_and_wait(topic, b"warm:0", key="warm")
    consumers = await _start(mesh, topic, group)
    done = asyncio.Event()
    reader = asyncio.create_task(_read(consumers, traffic, done))
    producers = [asyncio.create_task(_produce(mesh, topic, f"k{i}", traffic)) for i in range(KEYS)]
    try:
        await asyncio.sleep(2.0)
        _lose_disk(mesh, "broker-a", traffic)
        await asyncio.sleep(0.5)   # acks of the dead broker drained: later ones are the new one's
        traffic.generation = 1
        mesh.start_broker("broker-a")
        await asyncio.sleep(3.0)
        traffic.stop.set()
        await asyncio.gather(*producers)
        await _drain(traffic, 1)
    finally:
        traffic.stop.set()
        done.set()
        await reader
        for c in consumers:
            await c.stop()
    skipped, _ = traffic.report(1, "lost disk, live consumers")
    assert traffic.acked[1] and not skipped
    assert traffic.first_deliveries_in_key_order(1)
    assert sum(c.describe()["history_rewinds"] for c in consumers) >= 1


async def test_lost_disk_with_the_group_stopped_skips_nothing(one_broker: Mesh) -> None:
    """The group's offsets go with the disk; namesrv knows the group is older than the new
    store, so its reset policy ("latest") starts at the oldest offset, not the end."""
    mesh, topic, group = one_broker, unique("hist"), unique("g")
    traffic = Traffic()
    async with Admin(namesrv=mesh.namesrv) as admin:
        await admin.create_group(group)
    async with Producer(namesrv=mesh.namesrv) as p:
        await p.send_and_wait(topic, b"warm:0", key="warm")
    consumers = await _start(mesh, topic, group)
    done = asyncio.Event()
    reader = asyncio.create_task(_read(consumers, traffic, done))
    producers = [asyncio.create_task(_produce(mesh, topic, f"k{i}", traffic)) for i in range(KEYS)]
    try:
        await asyncio.sleep(1.5)
        done.set()
        await reader
        for c in consumers:
            await c.stop()   # offsets committed, then lost with the disk
        _lose_disk(mesh, "broker-a", traffic)
        await asyncio.sleep(0.5)
        traffic.generation = 1
        mesh.start_broker("broker-a")
        await asyncio.sleep(2.0)   # the group is down while the new broker takes messages
        consumers = await _start(mesh, topic, group)
        done = asyncio.Event()
        reader = asyncio.create_task(_read(consumers, traffic, done))
        await asyncio.sleep(1.0)
        traffic.stop.set()
        await asyncio.gather(*producers)
        await _drain(traffic, 1)
    finally:
        traffic.stop.set()
        done.set()
        await reader
        for c in consumers:
            await c.stop()
    skipped, _ = traffic.report(1, "lost disk, group stopped")
    assert traffic.acked[1] and not skipped
    assert traffic.first_deliveries_in_key_order(1)


async def test_topic_deleted_and_created_again_under_a_live_consumer(one_broker: Mesh) -> None:
    mesh, topic, group = one_broker, unique("hist"), unique("g")
    traffic = Traffic()
    async with Admin(namesrv=mesh.namesrv) as admin:
        await admin.create_topic(topic, queues=4)
    consumers = await _start(mesh, topic, group)
    done = asyncio.Event()
    reader = asyncio.create_task(_read(consumers, traffic, done))
    producers = [asyncio.create_task(_produce(mesh, topic, f"k{i}", traffic)) for i in range(KEYS)]
    try:
        await asyncio.sleep(1.5)
        async with Admin(namesrv=mesh.namesrv) as admin:
            await admin.delete_topic(topic)
            traffic.generation = 1
            await asyncio.sleep(1.0)
            with contextlib.suppress(AlreadyExistsError):   # a send may have auto-created it
                await admin.create_topic(topic, queues=4)
        await asyncio.sleep(2.0)
        traffic.stop.set()
        await asyncio.gather(*producers)
        await _drain(traffic, 1)
        await _drain(traffic, 0)
    finally:
        traffic.stop.set()
        done.set()
        await reader
        for c in consumers:
            await c.stop()
    skipped0, _ = traffic.report(0, "topic re-created, before")
    skipped, _ = traffic.report(1, "topic re-created, after")
    assert traffic.acked[1] and not skipped and not skipped0
    assert traffic.first_deliveries_in_key_order(1)


async def _bodies(consumer: Consumer, want: int, timeout_s: float) -> set[bytes]:
    loop = asyncio.get_running_loop()
    deadline, got = loop.time() + timeout_s, set()
    while len(got) < want and loop.time() < deadline:
        for records in (await consumer.getmany(timeout_ms=200)).values():
            got.update(r.body for r in records)
    return got


async def test_broadcasting_member_restarted_after_a_lost_disk_skips_nothing(
        one_broker: Mesh, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Its own offset file keeps the history of each position: its first PULL after the
    restart names it, and the broker's new log (further than that offset) sends it back."""
    mesh, topic, group = one_broker, unique("hist"), unique("g")
    path = tmp_path / "offsets.json"
    async with Admin(namesrv=mesh.namesrv) as admin:
        await admin.create_topic(topic, queues=1)
    await send_all(mesh.namesrv, topic, [b"old:%d" % i for i in range(30)])
    async with Consumer(topic, group=group, namesrv=mesh.namesrv, mode="broadcasting",
                        offset_store_path=path, auto_offset_reset="earliest", **FAST) as c:
        assert len(await _bodies(c, 30, 20)) == 30
    _lose_disk(mesh, "broker-a", Traffic())
    mesh.start_broker("broker-a")
    new = [b"new:%d" % i for i in range(50)]   # past the member's saved offset 30
    await send_all(mesh.namesrv, topic, new)
    async with Consumer(topic, group=group, namesrv=mesh.namesrv, mode="broadcasting",
                        offset_store_path=path, auto_offset_reset="earliest", **FAST) as c:
        got = await _bodies(c, 50, 20)
        assert got == set(new)
        assert c.describe()["history_rewinds"] >= 1


async def test_a_members_commit_from_the_lost_history_skips_nothing(one_broker: Mesh) -> None:
    """A live member's auto-commit can reach the restarted broker before its next PULL
    is sent back: its position in the lost history (30) lies past the new log's end (5).
    Lowered to that end without a history, the member that loads it next (a rebalance
    moves the queue) would start after 5 records the group never read; it goes to
    where the histories part (the new log's start) instead."""
    mesh, topic, group = one_broker, unique("hist"), unique("g")
    async with Admin(namesrv=mesh.namesrv) as admin:
        await admin.create_group(group)
        await admin.create_topic(topic, queues=1)
    await send_all(mesh.namesrv, topic, [b"old:%d" % i for i in range(30)])
    q = {"group": group, "topic": topic, "queue_id": 0}
    client = await WireClient.connect("127.0.0.1", mesh.brokers["broker-a"].port)
    try:
        fields, old = await client.pull(topic, 0, 0, group=group, max_count=100)
        assert len(old) == 30 and fields["next_offset"] == 30
        old_hist = fields["hist"]   # the member's position: 30, after a record of this history
    finally:
        await client.close()
    _lose_disk(mesh, "broker-a", Traffic())
    mesh.start_broker("broker-a")
    new = [b"new:%d" % i for i in range(5)]
    client = await WireClient.connect("127.0.0.1", mesh.brokers["broker-a"].port)
    try:
        await client.send(topic, 0, [message(b) for b in new])
        await client.call(RequestCode.COMMIT_OFFSET, {**q, "offset": 30, "hist": old_hist})
        assert (await client.call(RequestCode.QUERY_OFFSET, q)).fields["offset"] == 0
        # A position past the end in the history this log continues is still lowered to
        # the end (a member that read a master ahead of it): no duplicates made up.
        fields, _ = await client.pull(topic, 0, 0, group=group, max_count=100)
        await client.call(RequestCode.COMMIT_OFFSET, {**q, "offset": 9, "hist": fields["hist"]})
        assert (await client.call(RequestCode.QUERY_OFFSET, q)).fields["offset"] == 5
        await client.call(RequestCode.COMMIT_OFFSET, {**q, "offset": 30, "hist": old_hist})
    finally:
        await client.close()
    async with Consumer(topic, group=group, namesrv=mesh.namesrv, **FAST) as c:
        assert await _bodies(c, 5, 20) == set(new)
