"""Replication link (issue 9): real stores in one process, a master and slaves over real TCP.

What a broker relies on: the slave's log becomes byte-identical to the master's
while puts go on, a returning old master drops its diverged tail and then equals
the new master, sync waits resolve on acknowledgement and fail fast without a
slave, a follower reconnects after the master restarts, appended queues reach
the slave's callback; the consumer-offset table reaches it whole, in frames of at
most CHUNK_BYTES however large (issue 24: the old single snapshot of 16 MiB or more
was silently not sent), then only what changed, once per change.
"""
from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from ferry.errors import SlaveNotAvailableError
from ferry.store import FlushMode
from ferry_broker.consumer_offsets import ConsumerOffsetManager
from ferry_broker.offsets_codec import decode_changes, encode_file
from ferry_broker.replication import master as master_module
from ferry_broker.replication import protocol as p

from tests.broker.repl_support import (
    Master,
    Slave,
    fill,
    hello,
    open_master,
    open_slave,
    queue_ends,
    until,
    whole_log,
)


@pytest.fixture
async def master(tmp_path: Path) -> AsyncIterator[Master]:
    m = open_master(tmp_path / "master")
    await m.start()
    yield m
    assert m.server is not None
    await m.server.stop()
    m.store.close()


@pytest.fixture
async def slave(tmp_path: Path) -> AsyncIterator[Slave]:
    s = open_slave(tmp_path / "slave")
    yield s
    assert s.follower is not None
    await s.follower.stop()
    s.store.close()


def caught_up(m: Master, s: Slave) -> bool:
    return s.store.commit_log_max_offset == m.store.commit_log_max_offset


async def test_slave_log_is_byte_identical_after_streaming_under_concurrent_puts(
        master: Master, slave: Slave) -> None:
    rng = random.Random(1)
    master.put(50, rng)  # history before the slave arrives
    assert slave.follower is not None
    await slave.follower.follow(master.addr, 1, 0)
    for _ in range(160):  # ~8 MiB: crosses a 4 MiB segment end while streaming
        master.put(rng.randint(1, 20), rng, max_body=8000)
        await asyncio.sleep(0)
    await until(lambda: caught_up(master, slave))
    assert whole_log(slave.store) == whole_log(master.store)
    assert queue_ends(slave.store) == queue_ends(master.store)
    assert slave.appended == set(queue_ends(master.store))  # on_append named every queue
    assert slave.epochs.entries == master.epochs.entries
    assert slave.follower.status()["connected"] is True
    assert master.store.commit_log_max_offset > 4 << 20


async def test_diverged_tail_is_truncated_and_the_slave_then_equals_the_master(
        tmp_path: Path) -> None:
    rng = random.Random(2)
    a, b = open_master(tmp_path / "a", epoch=1), open_slave(tmp_path / "b")
    await a.start()
    assert b.follower is not None
    try:
        common = a.put(40, rng)
        await b.follower.follow(a.addr, 1, 0)
        await until(lambda: b.store.commit_log_max_offset == common)
        await b.follower.stop()
        # b is master of epoch 2 for a while and writes records a never gets
        b.epochs.append(2, common)
        for _ in range(5):
            fill(b.store, 10, rng)
        assert b.store.commit_log_max_offset > common
        # a wins epoch 3 and writes on; b returns and follows it
        a.epoch = 3
        a.epochs.append(3, common)
        a.put(30, rng)
        await b.follower.follow(a.addr, 3, 0)
        await until(lambda: caught_up(a, b) and b.follower.status()["connected"])
        assert whole_log(b.store) == whole_log(a.store)
        assert queue_ends(b.store) == queue_ends(a.store)
        assert b.epochs.entries == a.epochs.entries == [(1, 0), (3, common)]
        a.put(5, rng)  # and it keeps following
        await until(lambda: caught_up(a, b))
        assert whole_log(b.store) == whole_log(a.store)
    finally:
        await b.follower.stop()
        assert a.server is not None
        await a.server.stop()
        a.store.close()
        b.store.close()


async def test_wait_replicated_resolves_on_ack_and_fails_without_a_slave(
        master: Master, slave: Slave) -> None:
    assert master.server is not None and slave.follower is not None
    rng = random.Random(3)
    end = master.put(5, rng)
    with pytest.raises(SlaveNotAvailableError):
        await master.server.wait_replicated(end, 5000)  # no slave: at once
    await slave.follower.follow(master.addr, 1, 0)
    await until(lambda: bool(master.server and master.server.slaves()))
    for _ in range(20):
        end = master.put(3, rng)
        await master.server.wait_replicated(end, 10_000)
        assert slave.store.commit_log_max_offset >= end
    [info] = master.server.slaves()
    assert info["broker_id"] == 1 and info["acked_offset"] == end
    assert info["lag_bytes"] == 0 and info["lagging"] is False
    await slave.follower.stop()
    await until(lambda: master.server is not None and not master.server.slaves())
    with pytest.raises(SlaveNotAvailableError):
        await master.server.wait_replicated(master.put(1, rng), 5000)


async def test_wait_replicated_times_out_when_the_slave_does_not_acknowledge(
        master: Master) -> None:
    assert master.server is not None
    master.server.lag_bytes_max = 1024
    reader, writer = await asyncio.open_connection("127.0.0.1", master.server.port)
    try:  # a slave that says HELLO and then never acknowledges anything
        writer.write(hello(2))
        ftype, _ = await p.read_frame(reader)
        assert ftype is p.FrameType.WELCOME
        end = master.put(10, random.Random(4))
        with pytest.raises(SlaveNotAvailableError, match="within 200 ms"):
            await master.server.wait_replicated(end, 200)
        [info] = master.server.slaves()
        assert info["broker_id"] == 2 and info["acked_offset"] == 0
        assert info["lag_bytes"] == end and info["lagging"] is True
    finally:
        writer.close()
    await until(lambda: master.server is not None and not master.server.slaves())


async def test_follower_reconnects_after_the_master_restarts(master: Master,
                                                              slave: Slave) -> None:
    assert master.server is not None and slave.follower is not None
    rng = random.Random(5)
    master.put(10, rng)
    await slave.follower.follow(master.addr, 1, 0)
    await until(lambda: caught_up(master, slave))
    port = master.server.port
    await master.server.stop()
    await until(lambda: slave.follower is not None and not slave.follower.status()["connected"])
    master.put(10, rng)  # written while no server runs
    await master.start(port)
    master.put(10, rng)
    await until(lambda: caught_up(master, slave))
    assert whole_log(slave.store) == whole_log(master.store)
    assert slave.follower.status()["connected"] is True


async def test_a_refused_follower_keeps_retrying_and_links_once_allowed(
        master: Master, slave: Slave) -> None:
    assert master.server is not None and slave.follower is not None
    master.peers = {2}  # broker 1 is not (yet) a registered broker of the group
    master.put(5, random.Random(7))
    await slave.follower.follow(master.addr, 1, 0)
    await asyncio.sleep(0.3)  # a few refused attempts (not a timing assertion)
    assert slave.follower.status()["connected"] is False and not master.server.slaves()
    master.peers = {1, 2}
    await until(lambda: caught_up(master, slave))


async def test_two_slaves_follow_one_master_and_either_ack_releases_a_wait(
        master: Master, tmp_path: Path) -> None:
    assert master.server is not None
    s1, s2 = open_slave(tmp_path / "s1", 1), open_slave(tmp_path / "s2", 2)
    rng = random.Random(8)
    try:
        await s1.follower.follow(master.addr, 1, 0)
        await s2.follower.follow(master.addr, 1, 0)
        await until(lambda: master.server is not None and len(master.server.slaves()) == 2)
        for _ in range(10):
            await master.server.wait_replicated(master.put(5, rng), 10_000)
        await s2.follower.stop()  # one slave left: waits still succeed
        await until(lambda: master.server is not None and len(master.server.slaves()) == 1)
        await master.server.wait_replicated(master.put(5, rng), 10_000)
        await until(lambda: caught_up(master, s1))
        assert whole_log(s1.store) == whole_log(master.store)
        assert whole_log(s2.store) == whole_log(master.store)[:s2.store.commit_log_max_offset]
    finally:
        for s in (s1, s2):
            await s.follower.stop()
            s.store.close()


async def test_a_follower_survives_a_master_that_sends_garbage(
        master: Master, slave: Slave, caplog: pytest.LogCaptureFixture) -> None:
    """A peer that answers HELLO with junk: the follower logs, keeps its log, retries."""
    async def junk(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(100)
        writer.write(random.Random(12).randbytes(200))
        await writer.drain()
        writer.close()

    fake = await asyncio.start_server(junk, "127.0.0.1", 0)
    fake_port = fake.sockets[0].getsockname()[1]
    try:
        with caplog.at_level(logging.WARNING, logger="ferry_broker.replication.follower"):
            await slave.follower.follow(f"127.0.0.1:{fake_port}", 1, 0)
            await until(lambda: any("ended" in r.getMessage() for r in caplog.records))
        assert slave.store.commit_log_max_offset == 0
        assert slave.follower.status()["connected"] is False
    finally:
        fake.close()
        await fake.wait_closed()
    master.put(5, random.Random(13))
    await slave.follower.follow(master.addr, 1, 0)
    await until(lambda: caught_up(master, slave))


async def test_a_sync_flush_slave_acknowledges_only_durable_chunks(
        master: Master, tmp_path: Path) -> None:
    s = open_slave(tmp_path / "sync-slave", 1, flush_mode=FlushMode.SYNC)
    rng = random.Random(14)
    try:
        await s.follower.follow(master.addr, 1, 0)
        await until(lambda: master.server is not None and bool(master.server.slaves()))
        assert master.server is not None
        for _ in range(10):
            end = master.put(4, rng)
            await master.server.wait_replicated(end, 10_000)
            assert s.store.flushed_offset >= end
        assert whole_log(s.store) == whole_log(master.store)
    finally:
        await s.follower.stop()
        s.store.close()


def received(slave: Slave) -> list[tuple]:
    return [change for payload in slave.offsets for change in decode_changes(payload)]


async def test_the_table_then_only_its_changes_reach_the_slave(master: Master,
                                                               slave: Slave) -> None:
    master.offsets.commit("g", "orders", 0, 5)
    end = master.put(3, random.Random(6))
    await slave.follower.follow(master.addr, 1, 0)
    await until(lambda: len(slave.offsets) == 1)
    assert received(slave) == [(("g", "orders", 0), 5, None, None)]
    master.offsets.commit("g", "orders", 0, 9, "E1")
    master.offsets.commit("h", "audit", 1, 2, identity="ak-h")
    await until(lambda: len(slave.offsets) == 2)
    assert decode_changes(slave.offsets[1]) == [(("h", "audit", 1), 2, None, "ak-h"),
                                                (("g", "orders", 0), 9, "E1", None)]
    # Intervals with no change send nothing; the next change alone goes out.
    await asyncio.sleep(2.5 * master_module.OFFSETS_INTERVAL_MS / 1000)
    assert len(slave.offsets) == 2
    master.offsets.commit("g", "orders", 0, 9, "E1")   # no change
    master.offsets.commit("g", "orders", 1, 4)
    await until(lambda: len(slave.offsets) == 3)
    assert decode_changes(slave.offsets[2]) == [(("g", "orders", 1), 4, None, None)]
    status = slave.follower.status()
    assert status["master_end"] == end and status["connected"] is True


async def test_a_table_over_the_frame_limit_reaches_the_slave_whole(
        master: Master, slave: Slave, tmp_path: Path) -> None:
    """The file encoding of this table exceeds MAX_FRAME_BYTES: the old master logged and
    sent nothing. Now it goes out in frames of at most CHUNK_BYTES, and a slave's table
    merged from them equals the master's."""
    rng = random.Random(24)
    groups = [f"g{i:05d}-" + "x" * 120 for i in range(1100)]
    topics = [f"t{j:03d}-" + "y" * 120 for j in range(60)]
    for group in groups:
        for topic in topics:
            master.offsets.commit(group, topic, 0, rng.randint(0, 10**12),
                                  rng.randbytes(16).hex())
    table = master.offsets.snapshot()[1]
    assert len(encode_file(table)) > p.MAX_FRAME_BYTES
    await slave.follower.follow(master.addr, 1, 0)
    await until(lambda: len(received(slave)) >= len(table), timeout_s=60)
    assert all(len(payload) <= p.CHUNK_BYTES for payload in slave.offsets)
    copy = ConsumerOffsetManager(tmp_path / "copy.json")
    for payload in slave.offsets:
        copy.merge_snapshot(payload, lambda t, q: 10**13)
    assert dict(copy.items()) == dict(master.offsets.items())
    assert all(copy.query_hist(*key) == entry.hist for key, entry in table.items())
