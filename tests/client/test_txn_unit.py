"""TransactionProducer pieces without a mesh: states, checkers, broker-sent requests.

A small real asyncio TCP server plays the broker: it answers HEARTBEAT and
END_TRANSACTION, and pushes one-way CHECK_TRANSACTION frames down the
connection the producer registered on, as a broker does.
"""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from ferry import TransactionProducer, TxnState
from ferry.client.core.connection import BrokerConnection
from ferry.client.transactions.txn_checks import as_state, call_for_state, check_record
from ferry.codec import REAL_QUEUE_ID, REAL_TOPIC, TXN_GROUP, MessageFlag
from ferry.codec.properties import encode_properties
from ferry.codec.record import MessageIn, encode_record
from ferry.errors import TransactionStateError, UnknownCodeError
from ferry.names import HALF_TOPIC
from ferry.wire import Frame, FrameDecoder, RequestCode, encode_frame, error_response, response
from ferry.wire import request as make_request

GROUP = "orders-tx"


class FakeBroker:
    """Records requests; answers HEARTBEAT and END_TRANSACTION; can push requests."""

    def __init__(self) -> None:
        self.frames: list[Frame] = []
        self.writers: list[asyncio.StreamWriter] = []
        self.ended: dict[bytes, str] = {}
        self.got = asyncio.Event()
        self.server: asyncio.Server | None = None

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def stop(self) -> None:
        assert self.server is not None
        for w in self.writers:
            w.transport.abort()
        self.server.close()
        await self.server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.writers.append(writer)
        dec = FrameDecoder()
        while data := await reader.read(65536):
            for frame in dec.feed(data):
                self.frames.append(frame)
                self.got.set()
                if not frame.is_response and not frame.is_oneway:
                    writer.write(encode_frame(self._answer(frame)))

    def _answer(self, req: Frame) -> Frame:
        if req.code != RequestCode.END_TRANSACTION:
            return response(req)
        msg_id, action = bytes(req.fields["msg_id"]), req.fields["action"]
        if self.ended.setdefault(msg_id, action) != action:
            return error_response(req, TransactionStateError("ended the other way"))
        return response(req, {"state": "committed" if action == "commit" else "rolled_back",
                              "queue_offset": 0 if action == "commit" else -1})

    def push(self, code: int, fields: dict[str, Any], body: bytes = b"", *,
             oneway: bool = True, rid: int = 7) -> None:
        """Send a request to the client on the last connection (server to client)."""
        self.writers[-1].write(encode_frame(make_request(code, rid, fields, body,
                                                         oneway=oneway)))

    def of(self, code: int) -> list[Frame]:
        return [f for f in self.frames if f.code == code and not f.is_response]

    async def wait_for(self, pred: Any, timeout_s: float = 5.0) -> None:
        async with asyncio.timeout(timeout_s):
            while not pred():
                self.got.clear()
                await self.got.wait()


@pytest.fixture
async def broker() -> AsyncIterator[tuple[FakeBroker, str]]:
    b = FakeBroker()
    addr = await b.start()
    yield b, addr
    await b.stop()


class FakeNamesrv:
    def __init__(self, addr: str) -> None:
        self.addr = addr

    async def call(self, method: str, path: str, **_: Any) -> Any:
        assert (method, path) == ("GET", "/v1/brokers")
        return {"brokers": [{"name": "b1", "id": 0, "addr": self.addr},
                            {"name": "b1", "id": 1, "addr": "127.0.0.1:1"}]}   # a slave: skipped


def half_record(msg_id: bytes, topic: str = "orders", queue_id: int = 3) -> bytes:
    props = encode_properties({TXN_GROUP: GROUP, REAL_TOPIC: topic,
                               REAL_QUEUE_ID: str(queue_id)})
    return encode_record(MessageIn(HALF_TOPIC, 0, b"order body", keys="order-42",
                                   properties=props, msg_id=msg_id,
                                   flags=int(MessageFlag.TXN_HALF), born_ts_ms=1),
                         queue_offset=5, phy_offset=100, store_ts_ms=2)


# -- states -----------------------------------------------------------------------------
def test_state_mapping() -> None:
    assert as_state(TxnState.COMMIT, "x") is TxnState.COMMIT
    assert as_state("rollback", "x") is TxnState.ROLLBACK
    assert as_state("COMMIT", "x") is TxnState.COMMIT
    assert as_state(None, "x") is TxnState.UNKNOWN       # a forgotten return
    assert as_state(True, "x") is TxnState.UNKNOWN
    assert as_state("maybe", "x") is TxnState.UNKNOWN


async def test_checker_sync_async_and_exception() -> None:
    def plain(rec: str) -> TxnState:
        return TxnState.COMMIT

    async def coro(rec: str) -> TxnState:
        await asyncio.sleep(0)
        return TxnState.ROLLBACK

    def broken(rec: str) -> TxnState:
        raise RuntimeError("database down")

    async def broken_async(rec: str) -> TxnState:
        raise RuntimeError("database down")

    assert await call_for_state(plain, "r", what="t") is TxnState.COMMIT
    assert await call_for_state(coro, "r", what="t") is TxnState.ROLLBACK
    assert await call_for_state(broken, "r", what="t") is TxnState.UNKNOWN
    assert await call_for_state(broken_async, "r", what="t") is TxnState.UNKNOWN


# -- requests a broker sends on a client connection -------------------------------------
async def test_incoming_requests_reach_their_handler(broker: tuple[FakeBroker, str]) -> None:
    srv, addr = broker
    seen: list[Frame] = []

    def on_check(conn: BrokerConnection, frame: Frame) -> None:
        seen.append(frame)

    def buggy(conn: BrokerConnection, frame: Frame) -> None:
        raise RuntimeError("bug in a handler")

    conn = await BrokerConnection.open(addr, request_handlers={
        RequestCode.CHECK_TRANSACTION: on_check, 99: buggy})
    try:
        await conn.request(RequestCode.HEARTBEAT, {"group": GROUP})
        srv.push(RequestCode.CHECK_TRANSACTION, {"group": GROUP, "msg_id": b"\x01" * 16}, b"rec")
        srv.push(77, {})                  # unknown one-way: ignored
        srv.push(99, {})                  # its handler raises: logged only
        srv.push(78, {}, oneway=False, rid=42)   # unknown, wants an answer: UnknownCodeError
        await srv.wait_for(lambda: any(f.is_response for f in srv.frames))
        answer = next(f for f in srv.frames if f.is_response)
        assert (answer.request_id, answer.error) == (42, UnknownCodeError.code)
        assert len(seen) == 1 and seen[0].fields["msg_id"] == b"\x01" * 16
        assert bytes(seen[0].body) == b"rec"
        # the reader survived all of it: requests still work on the same connection
        assert not conn.closed
        await conn.request(RequestCode.HEARTBEAT, {"group": GROUP})
    finally:
        await conn.close()


# -- registration and check answers ------------------------------------------------------
async def _producer(addr: str, checker: Any) -> TransactionProducer:
    tp = TransactionProducer(group=GROUP, namesrv="127.0.0.1:1", checker=checker,
                             heartbeat_interval_ms=60_000, check_timeout_ms=500)
    tp._checks.namesrv = FakeNamesrv(addr)  # type: ignore[assignment]
    await tp._checks.start()
    return tp


async def test_heartbeat_registers_the_group_as_producer(broker: tuple[FakeBroker, str]) -> None:
    srv, addr = broker
    tp = await _producer(addr, lambda rec: TxnState.UNKNOWN)
    try:
        [hb] = srv.of(RequestCode.HEARTBEAT)
        assert hb.fields["group"] == GROUP and hb.fields["role"] == "producer"
        assert hb.fields["client_id"] == tp.client_id
    finally:
        await tp._checks.stop()
        await tp._pool.close()


@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_check_commit_answers_end_transaction(broker: tuple[FakeBroker, str],
                                                    kind: str) -> None:
    srv, addr = broker
    seen: list[Any] = []

    def plain(rec: Any) -> TxnState:
        seen.append(rec)
        return TxnState.COMMIT

    async def coro(rec: Any) -> TxnState:
        seen.append(rec)
        return TxnState.COMMIT

    tp = await _producer(addr, plain if kind == "sync" else coro)
    try:
        msg_id = bytes(range(16))
        srv.push(RequestCode.CHECK_TRANSACTION, {"group": GROUP, "msg_id": msg_id,
                                                 "topic": "orders"}, half_record(msg_id))
        await srv.wait_for(lambda: srv.of(RequestCode.END_TRANSACTION))
        [end] = srv.of(RequestCode.END_TRANSACTION)
        assert end.fields == {"group": GROUP, "msg_id": msg_id, "action": "commit",
                              "from_check": True, "by": "check"}
        [rec] = seen
        assert (rec.topic, rec.queue_id, rec.msg_id) == ("orders", 3, msg_id.hex().upper())
        assert rec.body == b"order body" and rec.key == "order-42"
    finally:
        await tp._checks.stop()
        await tp._pool.close()


async def test_unknown_exception_and_timeout_send_nothing(broker: tuple[FakeBroker, str]) -> None:
    srv, addr = broker
    answers = {1: "unknown", 2: "raise", 3: "hang", 4: "rollback"}

    async def checker(rec: Any) -> TxnState:
        what = answers[bytes.fromhex(rec.msg_id)[0]]
        if what == "raise":
            raise RuntimeError("no idea")
        if what == "hang":
            await asyncio.sleep(60)
        return TxnState(what)

    tp = await _producer(addr, checker)
    try:
        for n in (1, 2, 3, 4):
            msg_id = bytes([n]) * 16
            srv.push(RequestCode.CHECK_TRANSACTION, {"group": GROUP, "msg_id": msg_id},
                     half_record(msg_id))
        srv.push(RequestCode.CHECK_TRANSACTION, {"group": "other", "msg_id": b"\x09" * 16},
                 half_record(b"\x09" * 16))     # not our group: ignored
        await srv.wait_for(lambda: srv.of(RequestCode.END_TRANSACTION))
        await asyncio.sleep(0.7)   # past the 500 ms check timeout of the hanging one
        ends = srv.of(RequestCode.END_TRANSACTION)
        assert [(bytes(e.fields["msg_id"]), e.fields["action"]) for e in ends] == \
            [(b"\x04" * 16, "rollback")]
    finally:
        await tp._checks.stop()
        await tp._pool.close()


async def test_end_maps_state_errors(broker: tuple[FakeBroker, str]) -> None:
    srv, addr = broker
    tp = await _producer(addr, lambda rec: TxnState.UNKNOWN)
    try:
        msg_id = "AB" * 16
        assert await tp.end(addr, msg_id, TxnState.COMMIT) is TxnState.COMMIT
        assert await tp.end(addr, msg_id, TxnState.COMMIT) is TxnState.COMMIT   # same way: fine
        with pytest.raises(TransactionStateError):
            await tp.end(addr, msg_id, TxnState.ROLLBACK)
        end = srv.of(RequestCode.END_TRANSACTION)[0]
        assert end.fields["by"] == "producer" and end.fields["from_check"] is False
        with pytest.raises(ValueError):
            await tp.end(addr, msg_id, TxnState.UNKNOWN)
    finally:
        await tp._checks.stop()
        await tp._pool.close()


def test_a_checked_record_shows_the_users_keys_and_real_topic() -> None:
    msg_id = bytes(range(16))
    props = encode_properties({REAL_TOPIC: "orders", REAL_QUEUE_ID: "3", TXN_GROUP: "tx"})
    raw = encode_record(MessageIn(HALF_TOPIC, 0, b"b", keys=f"order-42 TXN:{msg_id.hex().upper()}",
                                  properties=props, msg_id=msg_id,
                                  flags=int(MessageFlag.TXN_HALF)),
                        queue_offset=0, phy_offset=0, store_ts_ms=1)
    frame = make_request(RequestCode.CHECK_TRANSACTION, 1, {"group": "tx", "topic": "orders"}, raw)
    record = check_record(frame, "127.0.0.1:1")
    assert record.keys == ("order-42",) and record.topic == "orders" and record.queue_id == 3
