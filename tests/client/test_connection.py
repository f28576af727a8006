"""BrokerConnection against a tiny real asyncio TCP server speaking the wire protocol."""
from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from ferry.client.core.connection import BrokerConnection, ConnectionPool
from ferry.errors import ConnectionLostError, RequestTimeoutError, TopicNotFoundError
from ferry.wire import Frame, FrameDecoder, encode_frame, error_response, response

Handler = Callable[[Frame, asyncio.StreamWriter], Awaitable[None]]


class TinyServer:
    """Answers each request by a handler; records one-way requests."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.oneway: list[Frame] = []
        self.writers: list[asyncio.StreamWriter] = []
        self.server: asyncio.Server | None = None
        self.tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return f"127.0.0.1:{port}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.writers.append(writer)
        dec = FrameDecoder()
        while data := await reader.read(65536):
            for frame in dec.feed(data):
                if frame.is_oneway:
                    self.oneway.append(frame)
                    continue
                task = asyncio.create_task(self.handler(frame, writer))
                self.tasks.add(task)
                task.add_done_callback(self.tasks.discard)
        writer.close()

    def drop_connections(self) -> None:
        for w in self.writers:
            w.transport.abort()

    async def stop(self) -> None:
        assert self.server is not None
        self.drop_connections()
        self.server.close()
        for t in list(self.tasks):
            t.cancel()
        await self.server.wait_closed()


async def handler(req: Frame, writer: asyncio.StreamWriter) -> None:
    """'delay' (s) waits before answering (so answers arrive out of order); 'fail' errors."""
    await asyncio.sleep(req.fields.get("delay", 0))
    if req.fields.get("never"):
        await asyncio.sleep(3600)
    if req.fields.get("fail"):
        writer.write(encode_frame(error_response(req, TopicNotFoundError("no such topic"))))
    else:
        writer.write(encode_frame(response(req, {"echo": req.fields.get("n")}, req.body)))


@pytest.fixture
async def server() -> AsyncIterator[tuple[TinyServer, str]]:
    srv = TinyServer(handler)
    addr = await srv.start()
    yield srv, addr
    await srv.stop()


async def test_concurrent_requests_are_matched_by_id(server: tuple[TinyServer, str]) -> None:
    _, addr = server
    conn = await BrokerConnection.open(addr)
    try:
        # later requests answer first: matching must be by id, not by order
        reqs = [conn.request(11, {"n": i, "delay": (20 - i) * 0.005}, body=bytes([i]) * i)
                for i in range(20)]
        answers = await asyncio.gather(*reqs)
        assert [a.fields["echo"] for a in answers] == list(range(20))
        assert [bytes(a.body) for a in answers] == [bytes([i]) * i for i in range(20)]
    finally:
        await conn.close()


async def test_error_response_raises_its_class(server: tuple[TinyServer, str]) -> None:
    _, addr = server
    conn = await BrokerConnection.open(addr)
    try:
        with pytest.raises(TopicNotFoundError, match="no such topic"):
            await conn.request(10, {"fail": True})
        assert (await conn.request(10, {"n": 1})).fields["echo"] == 1  # still usable
    finally:
        await conn.close()


async def test_timeout_fails_only_that_request(server: tuple[TinyServer, str]) -> None:
    _, addr = server
    conn = await BrokerConnection.open(addr, request_timeout_ms=10_000)
    try:
        slow = asyncio.ensure_future(conn.request(11, {"never": True}, timeout_ms=100))
        ok = asyncio.ensure_future(conn.request(11, {"n": 7, "delay": 0.2}))
        with pytest.raises(RequestTimeoutError):
            await slow
        assert (await ok).fields["echo"] == 7
        assert not conn.closed
    finally:
        await conn.close()


async def test_connection_loss_fails_exactly_the_pending(server: tuple[TinyServer, str]) -> None:
    srv, addr = server
    conn = await BrokerConnection.open(addr)
    done = await conn.request(11, {"n": 1})
    pending = [asyncio.ensure_future(conn.request(11, {"never": True})) for _ in range(3)]
    await asyncio.sleep(0.05)
    srv.drop_connections()
    for fut in pending:
        with pytest.raises(ConnectionLostError):
            await fut
    assert done.fields["echo"] == 1
    assert conn.closed
    with pytest.raises(ConnectionLostError):
        await conn.request(11, {"n": 2})
    await conn.close()


async def test_oneway_gets_no_response(server: tuple[TinyServer, str]) -> None:
    srv, addr = server
    conn = await BrokerConnection.open(addr)
    try:
        conn.send_oneway(10, {"n": 5}, b"body")
        assert (await conn.request(11, {"n": 6})).fields["echo"] == 6
        assert [f.fields["n"] for f in srv.oneway] == [5]
    finally:
        await conn.close()


async def test_pool_reconnects_after_loss(server: tuple[TinyServer, str]) -> None:
    srv, addr = server
    pool = ConnectionPool()
    try:
        first = await pool.get(addr)
        assert (await pool.request(addr, 11, {"n": 1})).fields["echo"] == 1
        srv.drop_connections()
        with contextlib.suppress(ConnectionLostError):
            await first.request(11, {"n": 2})
        await asyncio.sleep(0.05)
        assert (await pool.request(addr, 11, {"n": 3})).fields["echo"] == 3
        assert await pool.get(addr) is not first
    finally:
        await pool.close()


async def test_pool_replaces_a_connection_idle_past_idle_close_ms(
        server: tuple[TinyServer, str]) -> None:
    """Idle (nothing sent, nothing awaited) past `idle_close_ms`: closed and replaced on the
    next use, before the broker's own idle timeout could close it under a request. A
    connection with a request awaiting its answer, or one-way frames corked, is kept."""
    _, addr = server
    pool = ConnectionPool(idle_close_ms=200, tls=None)
    try:
        first = await pool.get(addr)
        parked = asyncio.ensure_future(first.request(11, {"n": 1, "delay": 0.5}))
        await asyncio.sleep(0.3)
        assert await pool.get(addr) is first  # its request is still out
        assert (await parked).fields["echo"] == 1
        first.send_oneway(10, {"n": 2})  # corked, not yet written
        assert await pool.get(addr) is first
        await asyncio.sleep(0.3)
        second = await pool.get(addr)
        assert second is not first and first.closed and not second.closed
        assert (await pool.request(addr, 11, {"n": 3})).fields["echo"] == 3
    finally:
        await pool.close()


async def test_connect_refused_is_connection_lost() -> None:
    from tests.support.procs import free_port
    with pytest.raises(ConnectionLostError):
        await BrokerConnection.open(f"127.0.0.1:{free_port()}")


async def test_oneway_sent_just_before_close_still_goes_out(
        server: tuple[TinyServer, str]) -> None:
    srv, addr = server
    conn = await BrokerConnection.open(addr)
    conn.send_oneway(10, {"n": 8}, b"last words")
    await conn.close()
    for _ in range(100):
        if srv.oneway:
            break
        await asyncio.sleep(0.01)
    assert [f.fields["n"] for f in srv.oneway] == [8]


async def test_bodies_stay_whole_across_reads_of_the_reused_buffer(
        server: tuple[TinyServer, str]) -> None:
    """The protocol reads every chunk into one reused buffer: what a response keeps
    (its body, a frame spanning reads) must not change when the next read lands there."""
    _, addr = server
    conn = await BrokerConnection.open(addr)
    try:
        big = bytes(range(256)) * 2400  # 600 KiB: more than one read buffer
        bodies = [big] + [bytes([i]) * (1000 + i) for i in range(60)]
        answers = await asyncio.gather(*(conn.request(10, {"n": i}, body)
                                         for i, body in enumerate(bodies)))
        for i, (body, answer) in enumerate(zip(bodies, answers, strict=True)):
            assert answer.fields["echo"] == i
            assert bytes(answer.body) == body
        assert type(answers[1].body) is bytes  # a copy, not a view into the buffer
    finally:
        await conn.close()
