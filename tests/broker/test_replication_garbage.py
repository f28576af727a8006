"""The replication port under hostile input: each bad connection is refused or closed,
logged as a warning, and the server goes on serving a real slave afterwards."""
from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from ferry_broker.replication import protocol as p

from tests.broker.repl_support import Master, hello, open_master, open_slave, until, whole_log

MASTER_LOG = "ferry_broker.replication.master"


@pytest.fixture
async def master(tmp_path: Path) -> AsyncIterator[Master]:
    m = open_master(tmp_path / "master")
    m.put(20, random.Random(9))
    await m.start()
    yield m
    assert m.server is not None
    await m.server.stop()
    m.store.close()


async def _still_serves(master: Master, root: Path) -> None:
    """A real slave links and catches up (the bad peer did no harm)."""
    s = open_slave(root)
    assert s.follower is not None
    try:
        await s.follower.follow(master.addr, master.epoch, 0)
        master.put(5, random.Random(10))
        await until(lambda: s.store.commit_log_max_offset == master.store.commit_log_max_offset)
        assert whole_log(s.store) == whole_log(master.store)
    finally:
        await s.follower.stop()
        s.store.close()


async def _exchange(port: int, data: bytes, *, eof: bool = False) -> bytes:
    """Send `data` (then EOF if asked); everything the server sends until it closes."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        if eof:
            writer.write_eof()
        return await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()


GARBAGE = {
    "random bytes": random.Random(11).randbytes(300),
    "oversized length": p.LENGTH.pack(p.MAX_FRAME_BYTES + 1) + b"\x01" + b"x" * 64,
    "zero length": p.LENGTH.pack(0) + b"xxxx",
    "unknown frame type": p.LENGTH.pack(5) + b"\x63" + b"abcd",
    "wrong magic": hello(magic=0xDEADBEEF),
    "not a HELLO first": b"".join(p.encode_offset(p.FrameType.ACK, 0)),
    "bad HELLO lengths": p.LENGTH.pack(1 + p.HELLO_HEAD.size + 2) + b"\x01"
    + p.HELLO_HEAD.pack(p.MAGIC, p.VERSION, 1, 1, 0) + p.U16.pack(900),
    "negative end offset": hello(end=-5),
    "HTTP request": b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
    "HELLO over MAX_HELLO_BYTES": p.LENGTH.pack(p.MAX_HELLO_BYTES + 2) + b"\x01" + b"x" * 64,
    "AUTH over MAX_AUTH_BYTES": p.LENGTH.pack(p.MAX_AUTH_BYTES + 1) + b"\x09" + b"x" * 64,
}


@pytest.mark.parametrize("name", sorted(GARBAGE))
async def test_garbage_closes_the_connection_and_the_server_goes_on(
        master: Master, tmp_path: Path, caplog: pytest.LogCaptureFixture, name: str) -> None:
    assert master.server is not None
    with caplog.at_level(logging.WARNING, logger=MASTER_LOG):
        answer = await _exchange(master.server.port, GARBAGE[name])
    assert answer == b""  # closed without a word: the stream cannot be trusted
    assert any(r.name == MASTER_LOG and r.levelno == logging.WARNING for r in caplog.records)
    await _still_serves(master, tmp_path / "slave")


async def test_a_truncated_frame_closes_the_connection(
        master: Master, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    assert master.server is not None
    whole = hello(1)
    with caplog.at_level(logging.WARNING, logger=MASTER_LOG):
        answer = await _exchange(master.server.port, whole[:len(whole) // 2], eof=True)
    assert answer == b""
    assert any("closed mid-frame" in r.getMessage() for r in caplog.records)
    await _still_serves(master, tmp_path / "slave")


REFUSED: dict[str, tuple[dict[str, Any], str]] = {
    "wrong cluster": (dict(cluster="OtherCluster"), "not OtherCluster/broker-a"),
    "wrong name": (dict(name="broker-b"), "not ReplCluster/broker-b"),
    "the master's own id": (dict(broker_id=0), "this master's own"),
    "not a peer": (dict(broker_id=7), "not a live broker of the group"),
    "newer epoch": (dict(epoch=5), "older than the slave's 5"),
    "unknown version": (dict(version=99), "version 99"),
}


@pytest.mark.parametrize("name", sorted(REFUSED))
async def test_a_wrong_peer_gets_refuse_then_a_close(
        master: Master, tmp_path: Path, caplog: pytest.LogCaptureFixture, name: str) -> None:
    assert master.server is not None
    fields, reason = REFUSED[name]
    kw: dict[str, Any] = {"broker_id": 1, **fields}
    with caplog.at_level(logging.WARNING, logger=MASTER_LOG):
        answer = await _exchange(master.server.port, hello(kw.pop("broker_id"), **kw))
    reader = asyncio.StreamReader()
    reader.feed_data(answer)
    reader.feed_eof()
    ftype, payload = await p.read_frame(reader)
    assert ftype is p.FrameType.REFUSE
    epoch, text = p.decode_refuse(payload)
    assert epoch == master.epoch and reason in text
    assert await reader.read() == b""  # nothing after the REFUSE: the master closed
    assert any(reason in r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
    assert master.server.slaves() == []
    await _still_serves(master, tmp_path / "slave")


async def test_a_silent_slave_is_dropped(master: Master, monkeypatch: pytest.MonkeyPatch) -> None:
    """A linked slave that stops acknowledging (even heartbeats) is dropped from slaves()."""
    assert master.server is not None
    from ferry_broker.replication import master as master_mod
    monkeypatch.setattr(master_mod, "LINK_IDLE_TIMEOUT_MS", 300)
    reader, writer = await asyncio.open_connection("127.0.0.1", master.server.port)
    try:
        writer.write(hello(1))
        ftype, _ = await p.read_frame(reader)
        assert ftype is p.FrameType.WELCOME
        assert [s["broker_id"] for s in master.server.slaves()] == [1]
        await until(lambda: master.server is not None and not master.server.slaves())
    finally:
        writer.close()
