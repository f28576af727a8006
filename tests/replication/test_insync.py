"""The in-sync set of a sync pair on real processes (issue 9): shrink, rejoin, clean elections.

- a slave hung (SIGSTOP) under sync sends: writes waiting for it answer the
  retriable SlaveNotAvailableError after repl_timeout_ms, the set shrinks to
  the master (stats), writes are acknowledged again; after SIGCONT the slave
  catches up and rejoins the set;
- a slave outside the set is never elected: the master dies while the only
  slave is out of the set, and the group stays without master (no acknowledged
  write can be lost that way) until the old master returns with its data and
  leads again.
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
from ferry import Message, Producer
from ferry.client.core.connection import BrokerConnection
from ferry.client.core.records import decode_pull_body
from ferry.client.producing.encoding import to_wire
from ferry.errors import FerryError, SlaveNotAvailableError
from ferry.wire import RequestCode, encode_messages

from tests.replication.load import Reader
from tests.support.ha import Cluster, HaBroker

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPL_TIMEOUT_MS = 1_000
TTL_S = 3
#: How long the group is watched for a (wrong) election of the out-of-sync slave.
NO_MASTER_WATCH_S = 3 * TTL_S


@dataclass
class Outcomes:
    """Each send's answer in order: "ok" or the error's type name."""

    results: list[str] = field(default_factory=list)

    def after(self, kind: str) -> list[str]:
        return self.results[self.results.index(kind) + 1:] if kind in self.results else []


async def _send_until(addr: str, topic: str, done: Callable[[Outcomes], bool],
                      timeout_s: float = 30.0) -> Outcomes:
    """Send one message at a time straight to `addr` (no retry) until `done(outcomes)`."""
    out = Outcomes()
    conn = await BrokerConnection.open(addr, request_timeout_ms=30_000)
    body = encode_messages([to_wire(Message(b"sync"))])
    deadline = time.monotonic() + timeout_s
    try:
        while not done(out):
            assert time.monotonic() < deadline, out.results[-20:]
            try:
                await conn.request(RequestCode.SEND, {"topic": topic, "queue_id": 0}, body)
            except FerryError as exc:
                out.results.append(type(exc).__name__)
            else:
                out.results.append("ok")
    finally:
        await conn.close()
    return out


def _slaves(master: HaBroker) -> list[dict]:
    return list(master.get_json("/v1/stats")["replication"].get("slaves") or [])


def _role(b: HaBroker) -> str:
    return str(b.get_json("/v1/stats")["replication"]["role"])


def _sync_pair(clusters: Callable[..., Cluster]) -> tuple[Cluster, HaBroker, HaBroker]:
    cluster = clusters(replication="sync", election_ttl_s=TTL_S,
                       broker_env={"FERRY_BROKER_REPL_TIMEOUT_MS": str(REPL_TIMEOUT_MS)})
    master, _ = cluster.wait_master("broker-a")
    slave = next(b for b in cluster.brokers.values() if b is not master)
    assert sorted(cluster.wait_insync("broker-a", 2)) == [0, 1]
    return cluster, master, slave


async def test_a_hung_slave_times_writes_out_leaves_the_set_and_rejoins(
        clusters: Callable[..., Cluster]) -> None:
    cluster, master, slave = _sync_pair(clusters)
    topic = "isr-pause"
    async with Producer(namesrv=cluster.namesrv) as producer:
        await producer.send_and_wait(topic, b"first")
    slave.pause()
    try:
        timeout = SlaveNotAvailableError.__name__
        out = await _send_until(master.addr, topic,
                                lambda o: o.after(timeout).count("ok") >= 5)
        # Writes answered the retriable timeout, then the set shrank and writes went on.
        assert timeout in out.results
        assert cluster.insync("broker-a") == [master.broker_id]
        assert [s["in_sync"] for s in _slaves(master)] in ([], [False])
    finally:
        slave.resume()
    # Back: it catches up and rejoins the set; writes wait for it again and succeed.
    assert sorted(await asyncio.to_thread(cluster.wait_insync, "broker-a", 2)) == [0, 1]
    out = await _send_until(master.addr, topic, lambda o: len(o.results) >= 5)
    assert out.results == ["ok"] * 5


async def test_a_slave_outside_the_set_is_never_elected(
        clusters: Callable[..., Cluster]) -> None:
    cluster, master, slave = _sync_pair(clusters)
    _, epoch = cluster.wait_master("broker-a")
    topic = "isr-unclean"
    async with Producer(namesrv=cluster.namesrv) as producer:
        await producer.send_and_wait(topic, b"first:0")   # (bodies the Reader parses)
        await producer.send_and_wait("isr-direct", b"first")
    slave.pause()
    try:
        # A write times out on the hung slave; the set shrinks; then one is acked alone.
        out = await _send_until(master.addr, "isr-direct", lambda o: "ok" in o.after(
            SlaveNotAvailableError.__name__))
        assert cluster.insync("broker-a") == [master.broker_id]
        async with Producer(namesrv=cluster.namesrv, retries=0) as producer:
            await producer.send_and_wait(topic, b"alone:0")   # only the master has it
        master.kill9()
    finally:
        slave.resume()
    # The slave lacks acknowledged writes: it must not lead, however long the key is free.
    deadline = time.monotonic() + NO_MASTER_WATCH_S
    while time.monotonic() < deadline:
        assert await asyncio.to_thread(_role, slave) != "master"
        await asyncio.sleep(0.2)
    assert slave.proc is not None and "not in the in-sync set" in slave.proc.log()
    # The old master returns with its data: it is in the set, so it leads again.
    await asyncio.to_thread(cluster.start_broker, master.name, master.broker_id)
    back, new_epoch = await asyncio.to_thread(cluster.wait_master, "broker-a",
                                              min_epoch=epoch + 1)
    assert back is master and new_epoch > epoch
    assert out.results.count("ok") >= 1
    reader = Reader(cluster.namesrv, topic, group="g-isr-unclean")
    await reader.start()
    try:
        assert await reader.wait_for({("first", 0), ("alone", 0)}, 30)
    finally:
        await reader.stop()
    # The slave follows it, catches up and rejoins the set.
    assert sorted(await asyncio.to_thread(cluster.wait_insync, "broker-a", 2)) == [0, 1]


async def _pull(addr: str, topic: str, offset: int, max_wait_ms: int = 0) -> tuple[str, int, int]:
    """One PULL of queue 0 at `offset`: (status, next_offset, records in the body)."""
    conn = await BrokerConnection.open(addr, request_timeout_ms=30_000)
    try:
        resp = await conn.request(RequestCode.PULL, {
            "group": "g-hw", "topic": topic, "queue_id": 0, "offset": offset,
            "max_count": 32, "max_wait_ms": max_wait_ms})
    finally:
        await conn.close()
    count = len(decode_pull_body(resp.body, topic, "broker-a")) if resp.body else 0
    return str(resp.fields["status"]), int(resp.fields["next_offset"]), count


async def test_a_sync_master_serves_only_what_its_in_sync_slaves_have(
        clusters: Callable[..., Cluster]) -> None:
    # A consumer must never see a record that a failover could take back (and then
    # write another one at its queue offset, which the consumer, past it, would skip).
    cluster, master, slave = _sync_pair(clusters)
    topic = "isr-visible"
    async with Producer(namesrv=cluster.namesrv) as producer:
        await producer.send_and_wait(topic, b"first")
    assert (await _pull(master.addr, topic, 0))[2] == 1
    slave.pause()
    try:
        conn = await BrokerConnection.open(master.addr, request_timeout_ms=30_000)
        body = encode_messages([to_wire(Message(b"unconfirmed"))])
        send = asyncio.ensure_future(
            conn.request(RequestCode.SEND, {"topic": topic, "queue_id": 0}, body))
        await asyncio.sleep(0.3)          # stored on the master, not on the hung slave
        assert not send.done()
        status, next_offset, count = await _pull(master.addr, topic, 1)
        assert (status, next_offset, count) == ("OFFSET_OVERFLOW_ONE", 1, 0)
        with pytest.raises(SlaveNotAvailableError):
            await send                    # never acknowledged: the slave did not confirm
        await conn.close()
        # The set shrinks to the master alone: what it holds is then what the group holds.
        deadline = time.monotonic() + 10
        while cluster.insync("broker-a") != [master.broker_id]:
            assert time.monotonic() < deadline, cluster.insync("broker-a")
            await asyncio.sleep(0.1)
        assert (await _pull(master.addr, topic, 1, max_wait_ms=2000))[2] == 1
    finally:
        slave.resume()
