"""The wire server's limits against exhaustion: refused clearly, counted in /v1/stats."""
from __future__ import annotations

import asyncio
import struct
from collections.abc import Iterator

import pytest
from ferry.wire import RequestCode, encode_frame, encode_messages, request

from tests.broker.conftest import Broker, start_broker
from tests.broker.wire_client import WireClient, message

pytestmark = pytest.mark.integration

PER_ADDR = 4
FRAME_LIMIT = (4 << 20) + (64 << 10)  # above the 4 MiB message limit, below the protocol's 16 MiB
PENDING_BUDGET = 2 * FRAME_LIMIT + 16  # two large frames arriving at once, not three
FRAME_TIMEOUT_MS = 1500


@pytest.fixture(scope="module")
def small_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    b = start_broker(tmp_path_factory.mktemp("limits"), None,
                     FERRY_BROKER_MAX_CONNECTIONS_PER_ADDR=str(PER_ADDR),
                     FERRY_BROKER_MAX_FRAME_BYTES=str(FRAME_LIMIT),
                     FERRY_BROKER_MAX_PENDING_FRAME_BYTES=str(PENDING_BUDGET),
                     FERRY_BROKER_FRAME_TIMEOUT_MS=str(FRAME_TIMEOUT_MS))
    yield b
    b.proc.stop()


def counts(broker: Broker) -> dict[str, int]:
    return dict(broker.get_json("/v1/stats")["limits"]["counts"])


async def test_connections_per_address_are_capped(small_broker: Broker) -> None:
    before = counts(small_broker)["connections_over_per_addr"]
    held = [await small_broker.client() for _ in range(PER_ADDR)]
    extra = await small_broker.client()
    await asyncio.wait_for(extra.closed.wait(), 5)  # closed by the broker, nothing read
    await extra.close()
    assert counts(small_broker)["connections_over_per_addr"] == before + 1
    for c in held:  # the admitted ones serve on
        assert (await c.send("limits", 0, [message(b"held")]))["count"] == 1
    await held.pop().close()
    again = await _admitted(small_broker)
    assert (await again.send("limits", 0, [message(b"after a close")]))["count"] == 1
    for c in [*held, again]:
        await c.close()
    limits = small_broker.get_json("/v1/stats")["limits"]
    assert limits["settings"]["max_connections_per_addr"] == PER_ADDR


async def _admitted(broker: Broker) -> WireClient:
    """A new connection once the broker has seen the last one close."""
    for _ in range(50):
        c = await broker.client()
        try:
            await c.send("limits", 0, [message(b"probe")])
            return c
        except (TimeoutError, ConnectionError):
            await c.close()
            await asyncio.sleep(0.05)
    raise AssertionError("no connection admitted after one closed")


async def test_a_frame_over_the_configured_limit_closes_before_it_is_sent(
        small_broker: Broker) -> None:
    before = counts(small_broker)["frames_malformed"]
    c = await small_broker.client()
    c.write_raw(struct.pack("<II", FRAME_LIMIT + 1, 16))  # only the announcement
    await asyncio.wait_for(c.closed.wait(), 5)
    await c.close()
    assert counts(small_broker)["frames_malformed"] == before + 1
    ok = await small_broker.client()
    assert (await ok.send("limits", 0, [message(b"x" * (4 << 20))]))["count"] == 1
    await ok.close()
    assert small_broker.get_json("/v1/stats")["limits"]["settings"]["max_frame_bytes"] \
        == FRAME_LIMIT


def big_send(request_id: int) -> bytes:
    """A SEND frame of nearly FRAME_LIMIT bytes."""
    body = encode_messages([message(b"b" * ((4 << 20) - 4096))])
    frame = encode_frame(request(RequestCode.SEND, request_id, {"topic": "limits",
                                                                "queue_id": 0}, body))
    assert 3 * (4 << 20) > PENDING_BUDGET and len(frame) <= FRAME_LIMIT + 4
    return frame


async def test_large_frames_share_a_budget_and_slow_senders_are_closed(
        small_broker: Broker) -> None:
    before = counts(small_broker)
    holders = [await small_broker.client() for _ in range(2)]
    for c in holders:  # each starts a large frame and stalls: together they fill the budget
        c.write_raw(big_send(1)[:100_000])
    await asyncio.sleep(0.3)
    assert small_broker.get_json("/v1/stats")["limits"]["pending_frame_bytes"] > FRAME_LIMIT
    late = await small_broker.client()
    frame = big_send(7)
    late.write_raw(frame)  # all of it: the broker reads a first part, then waits for room
    await asyncio.sleep(0.3)
    limits = small_broker.get_json("/v1/stats")["limits"]
    assert limits["waiting_for_pending_budget"] == 1
    assert limits["counts"]["pending_frames_waited"] == before["pending_frames_waited"] + 1
    small = await _admitted(small_broker)  # small requests do not wait for the budget
    await small.close()
    # The stalled senders are closed after FRAME_TIMEOUT_MS; the waiting frame then arrives.
    for c in holders:
        await asyncio.wait_for(c.closed.wait(), 10)
        await c.close()
    fut: asyncio.Future[object] = asyncio.get_running_loop().create_future()
    late.pending[7] = fut  # type: ignore[assignment]
    resp = await asyncio.wait_for(fut, 10)
    assert not resp.error and resp.fields["count"] == 1  # type: ignore[attr-defined]
    await late.close()
    after = counts(small_broker)
    assert after["frames_too_slow"] == before["frames_too_slow"] + 2
    assert small_broker.get_json("/v1/stats")["limits"]["pending_frame_bytes"] == 0
