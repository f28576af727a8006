"""The slave's frame reader (LinkProtocol) on a real TCP connection, on both event loops.

The follower reads the master's frames with LinkProtocol, which receives into one
buffer and hands out payload views: frames must come back whole whatever the TCP
splits, a frame larger than the buffer too, a view must stay valid while later
bytes arrive, and bad frames must fail as with `read_frame`.
"""
from __future__ import annotations

import asyncio
import os
import random
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import pytest
import uvloop
from ferry_broker.replication import protocol as p
from ferry_broker.replication.link import READ_BUFFER_BYTES, LinkProtocol

RUNNERS: dict[str, Callable[[Coroutine[Any, Any, None]], None]] = {
    "asyncio": asyncio.run, "uvloop": uvloop.run}


async def _with_peer(send: Callable[[asyncio.StreamWriter], Awaitable[None]],
                     read: Callable[[LinkProtocol], Awaitable[None]]) -> None:
    """A server that runs `send` on its end; `read` on a LinkProtocol connected to it."""
    async def serve(_r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            await send(w)
        finally:
            w.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    transport, link = await asyncio.get_running_loop().create_connection(
        LinkProtocol, "127.0.0.1", port)
    try:
        await asyncio.wait_for(read(link), 20)
    finally:
        transport.close()
        server.close()
        await server.wait_closed()


def _frames() -> list[tuple[p.FrameType, bytes]]:
    rng = random.Random(7)
    out = [(p.FrameType.DATA, os.urandom(rng.randint(16, p.CHUNK_BYTES))) for _ in range(6)]
    out.insert(3, (p.FrameType.OFFSETS, os.urandom(3 * READ_BUFFER_BYTES)))  # grows
    out.insert(1, (p.FrameType.HEARTBEAT, b"\x01" * 8))
    return out


@pytest.mark.parametrize("loop", sorted(RUNNERS))
@pytest.mark.parametrize("split", ["whole", "random", "tiny"])
def test_frames_come_back_whole_whatever_the_splits(loop: str, split: str) -> None:
    frames = _frames()
    wire = b"".join(b"".join(p.frame(t, payload)) for t, payload in frames)

    async def send(w: asyncio.StreamWriter) -> None:
        rng = random.Random(3)
        pos = 0
        while pos < len(wire):
            n = {"whole": len(wire), "random": rng.randint(1, 300_000),
                 "tiny": rng.randint(1, 7) if pos < 4096 else 65_536}[split]
            w.write(wire[pos:pos + n])
            await w.drain()
            pos += n

    async def read(link: LinkProtocol) -> None:
        for ftype, payload in frames:
            got_type, got = await link.read_frame()
            assert (got_type, bytes(got)) == (ftype, payload)
        with pytest.raises(asyncio.IncompleteReadError):
            await link.read_frame()

    RUNNERS[loop](_with_peer(send, read))


@pytest.mark.parametrize("loop", sorted(RUNNERS))
def test_a_payload_view_stays_valid_while_later_frames_arrive(loop: str) -> None:
    first, later = os.urandom(100_000), os.urandom(p.CHUNK_BYTES)

    async def send(w: asyncio.StreamWriter) -> None:
        w.writelines(p.frame(p.FrameType.DATA, first))
        for _ in range(4):
            w.writelines(p.frame(p.FrameType.DATA, later))
        await w.drain()

    async def read(link: LinkProtocol) -> None:
        _, view = await link.read_frame()
        await asyncio.sleep(0.2)  # the rest arrives meanwhile (it fills the buffer)
        assert bytes(view) == first
        for _ in range(4):
            _, view = await link.read_frame()
            assert bytes(view) == later

    RUNNERS[loop](_with_peer(send, read))


BAD = {
    "empty length": (p.LENGTH.pack(0) + b"\x04", "outside"),
    "oversized length": (p.LENGTH.pack(p.MAX_FRAME_BYTES + 1), "outside"),
    "unknown type": (p.LENGTH.pack(9) + b"\x63" + bytes(8), "unknown frame type 99"),
}


@pytest.mark.parametrize("loop", sorted(RUNNERS))
@pytest.mark.parametrize("bad", sorted(BAD))
def test_bad_frames_fail_as_read_frame_does(loop: str, bad: str) -> None:
    raw, why = BAD[bad]

    async def send(w: asyncio.StreamWriter) -> None:
        w.write(raw)
        await w.drain()
        await asyncio.sleep(0.5)

    async def read(link: LinkProtocol) -> None:
        with pytest.raises(p.ReplicationProtocolError, match=why):
            await link.read_frame()

    RUNNERS[loop](_with_peer(send, read))


@pytest.mark.parametrize("loop", sorted(RUNNERS))
def test_a_peer_closing_mid_frame_is_an_incomplete_read(loop: str) -> None:
    async def send(w: asyncio.StreamWriter) -> None:
        w.write(b"".join(p.frame(p.FrameType.DATA, bytes(1000)))[:500])
        await w.drain()

    async def read(link: LinkProtocol) -> None:
        with pytest.raises(asyncio.IncompleteReadError):
            await link.read_frame()

    RUNNERS[loop](_with_peer(send, read))
