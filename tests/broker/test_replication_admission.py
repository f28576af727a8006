"""Who gets a link on a real master's replication port (admission.py), on broker processes.

With auth on: a peer is authenticated before the master reads anything large (a huge
first frame is refused from its first 5 bytes, a slow one cut at the handshake
timeout); silent peers that reconnect at once cannot keep the real slave out, and a
sync write is then acknowledged with both copies; an identity granted `replicate` on
broker id 1 cannot link as id 2; an AUTH frame signed for one master is refused by
another. With auth off: a HELLO naming a linked slave's id does not take its link.
"""
from __future__ import annotations

import asyncio
import contextlib
import hashlib
from pathlib import Path
from typing import Any

import pytest
from ferry.auth.signing import sign_repl
from ferry.client.core.connection import BrokerConnection
from ferry.wire import RequestCode
from ferry_broker.config import BrokerConfig
from ferry_broker.replication import protocol as p

from tests.broker import roles_support
from tests.broker.auth_support import ADMIN_RULES, creds, rules, seed_async
from tests.broker.conftest import Broker, unique_prefix
from tests.broker.roles_support import eventually, identity, start_member
from tests.broker.wire_client import encode_messages, message
from tests.support.procs import Etcd, free_port

group, prefix = roles_support.group, roles_support.prefix  # fixtures

pytestmark = pytest.mark.integration

IDENTITIES = {"root": ADMIN_RULES,
              "broker-a-0": rules(("allow", "broker:broker-a/0", "replicate")),
              "broker-a-1": rules(("allow", "broker:broker-a/1", "replicate"))}
CLUSTER = BrokerConfig.cluster
#: Silent peers held open at once, each reopened soon after the master closes it.
FLOOD = 96


def member(group: Any, broker_id: int, access_key: str | None, **env: str) -> Broker:
    """A member of broker-a with its own replication port (auth on as `access_key`)."""
    return group(broker_id, FERRY_BROKER_REPL_PORT=str(free_port()),
                 **(identity(access_key) if access_key else {}), **env)


def repl_port(b: Broker) -> int:
    return int(b.env["FERRY_BROKER_REPL_PORT"])


def status(b: Broker, access_key: str | None = "root") -> dict[str, Any]:
    return roles_support.replication(b, access_key)


def is_master(b: Broker, access_key: str | None = "root") -> bool:
    r = status(b, access_key)
    return bool(r["role"] == "master" and r["writable"])


def connected(b: Broker, access_key: str | None = "root") -> bool:
    return bool(status(b, access_key).get("follower", {}).get("connected", False))


def hello(broker_id: int, name: str = "broker-a") -> bytes:
    """A HELLO payload of an empty slave following epoch 0."""
    frame = b"".join(p.encode_hello(p.Hello(p.MAGIC, p.VERSION, broker_id, 0, 0, CLUSTER, name,
                                            [])))
    return frame[p.LENGTH.size + p.TYPE.size:]


def auth_frame(access_key: str, master_id: int, hello_payload: bytes) -> bytes:
    """The AUTH frame a slave running as `access_key` sends to broker-a's master `master_id`."""
    digest = hashlib.sha256(hello_payload).digest()
    s = sign_repl(creds(access_key), p.master_target(CLUSTER, "broker-a", master_id), digest)
    return b"".join(p.encode_auth(s.access_key, s.ts_ms, s.nonce, s.signature, digest))


async def answer(port: int, data: bytes) -> str | None:
    """Send `data`; the reason of the master's REFUSE (None: it answered something else)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        await writer.drain()
        ftype, payload = await asyncio.wait_for(p.read_frame(reader), 20)
        return p.decode_refuse(payload)[1] if ftype is p.FrameType.REFUSE else None
    finally:
        writer.close()


async def test_a_huge_or_slow_first_frame_is_cut_before_it_is_read(group: Any, etcd: Etcd,
                                                                   prefix: str) -> None:
    await seed_async(etcd.endpoint, prefix, IDENTITIES)
    master = member(group, 0, "broker-a-0", FERRY_BROKER_REPL_HANDSHAKE_TIMEOUT_MS="1000")
    await eventually(lambda: is_master(master))
    for ftype in (p.FrameType.HELLO, p.FrameType.AUTH):
        # A frame announcing MAX_FRAME_BYTES: the master does not take its payload in
        # (before: it read all 16 MiB of a HELLO, and only then asked for the AUTH).
        reader, writer = await asyncio.open_connection("127.0.0.1", repl_port(master))
        writer.write(p.LENGTH.pack(p.MAX_FRAME_BYTES) + p.TYPE.pack(ftype))
        with pytest.raises(ConnectionError):
            for _ in range(p.MAX_FRAME_BYTES >> 16):
                writer.write(bytes(1 << 16))
                await asyncio.wait_for(writer.drain(), 20)
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()
    # A valid AUTH frame, one byte at a time: cut at the handshake timeout, unfinished.
    data = auth_frame("broker-a-1", 0, hello(1))
    reader, writer = await asyncio.open_connection("127.0.0.1", repl_port(master))
    closed = asyncio.ensure_future(reader.read())
    sent = 0
    with contextlib.suppress(ConnectionError):
        while not closed.done() and sent < len(data):
            writer.write(data[sent:sent + 1])
            await writer.drain()
            sent += 1
            await asyncio.sleep(0.2)
    with contextlib.suppress(ConnectionError):   # a reset is a close too
        assert await asyncio.wait_for(closed, 20) == b""
    assert closed.done() and sent < len(data)
    writer.close()
    assert master.proc.alive() and is_master(master)


async def _flood(port: int, stop: asyncio.Event, opened: list[int]) -> None:
    """Keep FLOOD silent connections open, reopening each soon after the master closes it."""
    async def one() -> None:
        while not stop.is_set():
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
            except OSError:
                await asyncio.sleep(0.05)
                continue
            opened[0] += 1
            try:
                await reader.read()   # silent until the master closes it
            except OSError:
                pass
            finally:
                writer.close()
            await asyncio.sleep(0.05)
    await asyncio.gather(*(one() for _ in range(FLOOD)))


async def test_silent_peers_cannot_keep_the_slave_out(group: Any, etcd: Etcd,
                                                      prefix: str) -> None:
    await seed_async(etcd.endpoint, prefix, IDENTITIES)
    strict = {"mode": "sync", "FERRY_BROKER_MIN_INSYNC_REPLICAS": "2"}
    master = member(group, 0, "broker-a-0", **strict)
    await eventually(lambda: is_master(master))
    stop, opened = asyncio.Event(), [0]
    flood = asyncio.ensure_future(_flood(repl_port(master), stop, opened))
    try:
        await eventually(lambda: opened[0] >= FLOOD)
        slave = member(group, 1, "broker-a-1", **strict)
        await eventually(lambda: connected(slave), timeout_s=60)
        await eventually(lambda: status(master)["insync"]["members"] == [0, 1])
        conn = await BrokerConnection.open(f"127.0.0.1:{master.port}", credentials=creds("root"))
        try:
            # min_insync_replicas 2: acknowledged means both brokers have it.
            resp = await conn.request(RequestCode.SEND, {"topic": "flooded", "queue_id": 0},
                                      encode_messages([message(b"both copies")]))
            assert resp.fields["count"] == 1
        finally:
            await conn.close()
        assert opened[0] > FLOOD   # the flood went on all along
    finally:
        stop.set()
        flood.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await flood


async def test_an_identity_replicates_only_as_its_broker_id(group: Any, etcd: Etcd,
                                                            prefix: str) -> None:
    await seed_async(etcd.endpoint, prefix, IDENTITIES)
    master = member(group, 0, "broker-a-0")
    await eventually(lambda: is_master(master))
    impostor = member(group, 2, "broker-a-1")   # granted broker id 1, runs as id 2
    await eventually(lambda: "may not 'replicate' on 'broker:broker-a/2'" in master.proc.log())
    assert not connected(impostor)
    real = member(group, 1, "broker-a-1")
    await eventually(lambda: connected(real))
    assert [s["broker_id"] for s in status(master)["slaves"]] == [1]


async def test_an_auth_frame_for_one_master_is_refused_by_another(
        group: Any, etcd: Etcd, prefix: str, tmp_path: Path) -> None:
    """Master A is broker 0 of one mesh, master B broker 1 of another (same identities):
    an AUTH that a slave signed for A passes A's checks and fails B's."""
    other = unique_prefix()
    for where in (prefix, other):
        await seed_async(etcd.endpoint, where, IDENTITIES)
    master_a = member(group, 0, "broker-a-0")
    (tmp_path / "b").mkdir()
    master_b = start_member(tmp_path / "b", etcd, other, 1, FERRY_BROKER_REPL_PORT=str(
        free_port()), **identity("broker-a-1"))
    try:
        await eventually(lambda: is_master(master_a) and is_master(master_b))
        payload = hello(1)
        frames = auth_frame("broker-a-1", 0, payload) + b"".join(
            p.frame(p.FrameType.HELLO, payload))
        at_a = await answer(repl_port(master_a), frames)
        # A took the AUTH and judged the HELLO (broker 1 is no live broker of its mesh).
        assert at_a == "broker 1 is not a live broker of the group"
        at_b = await answer(int(master_b.env["FERRY_BROKER_REPL_PORT"]), frames)
        assert at_b is not None and "bad signature" in at_b
        assert f"{CLUSTER}/broker-a/1" in at_b
    finally:
        master_b.proc.stop()


async def test_with_auth_off_a_hello_naming_a_linked_slave_does_not_take_its_link(
        group: Any) -> None:
    master = member(group, 0, None, mode="sync")
    await eventually(lambda: is_master(master, None))
    slave = member(group, 1, None, mode="sync")
    await eventually(lambda: connected(slave, None))
    linked = status(master, None)["slaves"]
    assert [s["broker_id"] for s in linked] == [1]
    reason = await answer(repl_port(master), b"".join(p.frame(p.FrameType.HELLO, hello(1))))
    assert reason is not None and "linked already" in reason
    assert status(master, None)["slaves"][0]["addr"] == linked[0]["addr"]
    assert connected(slave, None)
    client = await master.client()
    acks = [await client.send("kept", 0, [message(b"through the real slave")])]
    await client.close()
    assert acks[0]["queue_offset"] == 0
