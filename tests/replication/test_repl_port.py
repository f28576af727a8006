"""The replication port of a real master process under garbage, unknown and silent peers.

Each bad connection is closed (garbage: without a word; a well-formed HELLO
from a broker that is no peer: REFUSE with a reason, then close; a peer that
does not finish its handshake: after the handshake timeout). The master process
survives all of it, its real slave stays (or gets) linked, and writes are
still acknowledged (sync: through that slave).
"""
from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable

import pytest
from ferry import Producer
from ferry_broker.replication import protocol as p
from ferry_broker.replication.admission import HANDSHAKE_TIMEOUT_MS, MAX_PENDING

from tests.support.ha import Cluster, HaBroker

pytestmark = pytest.mark.integration

GARBAGE = {
    "random bytes": random.Random(7).randbytes(500),
    "oversized length": p.LENGTH.pack(p.MAX_FRAME_BYTES + 1) + b"\x01" + b"x" * 64,
    "unknown frame type": p.LENGTH.pack(5) + b"\x63" + b"abcd",
    "HTTP request": b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
    "truncated HELLO": b"".join(p.encode_hello(p.Hello(p.MAGIC, p.VERSION, 1, 1, 0,
                                                       "TestCluster", "broker-a", [])))[:20],
}


def _hello(broker_id: int, *, cluster: str = "TestCluster", name: str = "broker-a",
           magic: int = p.MAGIC) -> bytes:
    return b"".join(p.encode_hello(p.Hello(magic, p.VERSION, broker_id, 1, 0, cluster, name,
                                           [])))


PEERS = {
    "wrong magic": (_hello(1, magic=0xDEADBEEF), False),
    "unknown broker id": (_hello(7), True),
    "wrong group name": (_hello(1, name="broker-z"), True),
    "wrong cluster": (_hello(1, cluster="Elsewhere"), True),
    "the master's own id": (_hello(0), True),   # the master is broker 0 below
}


async def _exchange(port: int, data: bytes) -> bytes:
    """Send `data`, half-close, and read until the master closes."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        writer.write_eof()
        return await asyncio.wait_for(reader.read(), 15)
    finally:
        writer.close()


async def _refused(answer: bytes) -> str:
    reader = asyncio.StreamReader()
    reader.feed_data(answer)
    reader.feed_eof()
    ftype, payload = await p.read_frame(reader)
    assert ftype is p.FrameType.REFUSE
    _, reason = p.decode_refuse(payload)
    assert await reader.read() == b""
    return reason


def _linked_slaves(master: HaBroker) -> list[int]:
    section = master.get_json("/v1/stats")["replication"]
    return sorted(int(s["broker_id"]) for s in section.get("slaves", []))


async def test_the_replication_port_refuses_garbage_and_strangers_and_goes_on(
        clusters: Callable[..., Cluster]) -> None:
    cluster = clusters(replication="sync")
    master, _ = cluster.wait_master("broker-a")
    assert master.broker_id == 0
    async with Producer(namesrv=cluster.namesrv, retries=20, retry_backoff_ms=100) as producer:
        await producer.send_and_wait("ha-port", b"before")
        for name, data in GARBAGE.items():
            assert await _exchange(master.repl_port, data) == b"", name
        for name, (data, refuse) in PEERS.items():
            answer = await _exchange(master.repl_port, data)
            if refuse:
                assert (await _refused(answer)), name   # a reason is given
            else:
                assert answer == b"", name
        assert master.alive()
        assert master.get_json("/healthz")["status"] == "ok"
        assert await asyncio.to_thread(_linked_slaves, master) == [1]
        result = await producer.send_and_wait("ha-port", b"after")
        assert result.broker == "broker-a"
    assert cluster.master("broker-a")[0] is master   # type: ignore[index]


async def test_silent_peers_are_dropped_after_the_handshake_timeout_and_a_slave_links(
        clusters: Callable[..., Cluster]) -> None:
    """Peers that take every pending slot of the port and never finish a HELLO (silent, or 3
    bytes of one) are closed after HANDSHAKE_TIMEOUT_MS (the oldest sooner, when the slave's
    connection takes its slot); the real slave, restarted meanwhile, links."""
    cluster = clusters(replication="sync")
    master, _ = cluster.wait_master("broker-a")
    slave = next(b for b in cluster.brokers.values() if b is not master)
    slave.kill9()
    while await asyncio.to_thread(_linked_slaves, master):  # the master saw the link end
        await asyncio.sleep(0.1)
    started = time.monotonic()
    peers = [await asyncio.open_connection("127.0.0.1", master.repl_port)
             for _ in range(MAX_PENDING)]
    peers[0][1].write(_hello(1)[:3])

    async def closed_after(reader: asyncio.StreamReader) -> float:
        assert await asyncio.wait_for(reader.read(), HANDSHAKE_TIMEOUT_MS / 1000 + 20) == b""
        return time.monotonic() - started

    closes = [asyncio.create_task(closed_after(r)) for r, _ in peers]
    await asyncio.to_thread(cluster.start_broker, "broker-a", slave.broker_id)  # dials the full port
    for took in await asyncio.gather(*closes):
        assert took <= HANDSHAKE_TIMEOUT_MS / 1000 + 10
    for _, writer in peers:
        writer.close()
    await asyncio.to_thread(cluster.wait_linked, "broker-a", 1)
    assert await asyncio.to_thread(_linked_slaves, master) == [slave.broker_id]
    async with Producer(namesrv=cluster.namesrv, retries=20, retry_backoff_ms=100) as producer:
        result = await producer.send_and_wait("ha-silent", b"after")
        assert result.broker == "broker-a"
