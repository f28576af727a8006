"""Hostile input: each bad request is refused clearly and the broker keeps serving others."""
from __future__ import annotations

import asyncio
import random
import struct

import pytest
from ferry.errors import InvalidNameError, MessageTooLargeError, UnknownCodeError
from ferry.wire import RequestCode, check_response, encode_messages

from tests.broker.conftest import Broker
from tests.broker.wire_client import WireClient, message

pytestmark = pytest.mark.integration

PREFIX = struct.Struct("<II")


async def assert_serves(broker: Broker) -> None:
    """A normal request on a fresh connection succeeds."""
    c = await broker.client()
    try:
        ack = await c.send("healthy", 0, [message(b"still here")])
        assert ack["count"] == 1
    finally:
        await c.close()


async def assert_closed_by_broker(c: WireClient) -> None:
    await asyncio.wait_for(c.closed.wait(), 5)
    await c.close()


async def test_two_gib_frame_closes_only_that_connection(broker: Broker) -> None:
    bystander = await broker.client()
    c = await broker.client()
    c.write_raw(PREFIX.pack(2**31, 16))
    await assert_closed_by_broker(c)
    await bystander.send("healthy", 0, [message(b"bystander")])  # its connection is untouched
    await bystander.close()
    await assert_serves(broker)


async def test_header_longer_than_frame_closes(broker: Broker) -> None:
    c = await broker.client()
    c.write_raw(PREFIX.pack(20, 1000) + bytes(16))
    await assert_closed_by_broker(c)
    await assert_serves(broker)


async def test_random_bytes_close(broker: Broker) -> None:
    rng = random.Random(7)
    garbage = bytes(rng.getrandbits(8) for _ in range(4096))
    c = await broker.client()
    c.write_raw(garbage)
    await assert_closed_by_broker(c)
    # A plausible prefix followed by a header that is not msgpack.
    c = await broker.client()
    c.write_raw(PREFIX.pack(4 + 64 + 32, 64) + b"\xc1" * 96)
    await assert_closed_by_broker(c)
    await assert_serves(broker)


async def test_unknown_code_is_an_error_response(client: WireClient, broker: Broker) -> None:
    resp = await client.request(99, {"anything": 1})
    with pytest.raises(UnknownCodeError):
        check_response(resp)
    assert not client.closed.is_set()
    await client.send("healthy", 0, [message(b"same connection")])
    await assert_serves(broker)


async def test_five_mib_body_is_too_large(client: WireClient, broker: Broker) -> None:
    body = encode_messages([message(b"x" * (5 << 20))], max_body_bytes=8 << 20)
    with pytest.raises(MessageTooLargeError):
        await client.call(RequestCode.SEND, {"topic": "big", "queue_id": 0}, body)
    await assert_serves(broker)


async def test_invalid_topic_name(client: WireClient, broker: Broker) -> None:
    for bad in ("bad topic", "", "%RETRY%", "x" * 200, 42, None):
        with pytest.raises(InvalidNameError):
            await client.call(RequestCode.SEND, {"topic": bad, "queue_id": 0},
                              encode_messages([message(b"x")]))
    await assert_serves(broker)


async def test_broker_log_has_no_crash(broker: Broker) -> None:
    await assert_serves(broker)
    assert "crashed" not in broker.proc.log()
