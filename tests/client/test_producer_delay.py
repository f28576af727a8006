"""Delay and TTL on the producer side: properties, flags, the SEND's `flags` and `offsets`.

The SEND requests go to an in-process stand-in for the broker that answers
a flagged SEND with per-entry `offsets` (-1 for a delayed entry) as the
protocol says; the delay scheduler's cancel endpoint is a small aiohttp app.
"""
from __future__ import annotations

import time
from typing import Any

import pytest
from aiohttp import web
from ferry.client import Message
from ferry.client.producing.encoding import DEFAULT_MAX_DELAY_MS, timing
from ferry.codec import DELIVER_AT_MS, TTL_MS, MessageFlag
from ferry.codec.properties import decode_properties
from ferry.errors import (
    AlreadyDeliveredError,
    InvalidDelayError,
    MalformedRequestError,
    MessageNotFoundError,
)
from ferry.wire import decode_messages

from tests.client.test_producer_unit import FakeFrame, _producer
from tests.support.procs import free_port

DAY_MS = 86_400_000


class FlagBroker:
    """Records each SEND's fields and entries; answers flagged SENDs with `offsets`."""

    def __init__(self) -> None:
        self.sends: list[tuple[dict[str, Any], list[Any]]] = []
        self.next_offset = 0

    async def request(self, addr: str, code: int, fields: dict[str, Any],
                      body: bytes = b"") -> FakeFrame:
        entries = decode_messages(body)
        self.sends.append((dict(fields), entries))
        first = self.next_offset
        offsets = []
        for e in entries:
            if e.flags & MessageFlag.DELAY:
                offsets.append(-1)
            else:
                offsets.append(self.next_offset)
                self.next_offset += 1
        answer: dict[str, Any] = {"queue_offset": first, "queue_id": fields["queue_id"]}
        if fields.get("flags"):
            answer["offsets"] = offsets
        return FakeFrame(answer)


def test_timing_properties_and_flags() -> None:
    now = 1_700_000_000_000
    assert timing(None, None, None, DEFAULT_MAX_DELAY_MS, now) == ({}, 0)
    assert timing(500, None, None, DEFAULT_MAX_DELAY_MS, now) == \
        ({DELIVER_AT_MS: str(now + 500)}, MessageFlag.DELAY)
    assert timing(None, now + 9, 1000, DEFAULT_MAX_DELAY_MS, now) == \
        ({DELIVER_AT_MS: str(now + 9), TTL_MS: "1000"}, MessageFlag.DELAY | MessageFlag.TTL)
    # 0 delay, a due time now or in the past, and a 0 TTL mean "no delay" / "no expiry"
    assert timing(0, None, 0, DEFAULT_MAX_DELAY_MS, now) == ({}, 0)
    assert timing(None, now - 5_000, None, DEFAULT_MAX_DELAY_MS, now) == ({}, 0)
    assert timing(30 * DAY_MS, None, None, DEFAULT_MAX_DELAY_MS, now)[1] == MessageFlag.DELAY


@pytest.mark.parametrize(("delay", "at", "ttl"), [
    (-1, None, None), (40 * DAY_MS, None, None), (None, 1_700_000_000_000 + 31 * DAY_MS, None),
    (None, -3, None), (None, None, -1), (1.5, None, None), (True, None, None),
])
def test_bad_delays_are_refused(delay: Any, at: Any, ttl: Any) -> None:
    with pytest.raises(InvalidDelayError):
        timing(delay, at, ttl, DEFAULT_MAX_DELAY_MS, 1_700_000_000_000)


def test_delay_and_deliver_at_together_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="not both"):
        timing(5, 1_700_000_000_005, None, DEFAULT_MAX_DELAY_MS, 1_700_000_000_000)


async def test_send_announces_flags_and_reads_offsets() -> None:
    p = _producer("t")
    broker = FlagBroker()
    p._pool.request = broker.request  # type: ignore[method-assign]
    before_ms = int(time.time() * 1000)
    plain = await p.send("t", b"plain", queue_selector=lambda qs, m: qs[0])
    late = await p.send("t", b"late", delay_ms=60_000, properties={"a": "b"},
                        queue_selector=lambda qs, m: qs[0])
    brief = await p.send("t", b"brief", ttl_ms=5_000, queue_selector=lambda qs, m: qs[0])
    results = [await plain, await late, await brief]
    (fields, entries), = broker.sends   # one frame: the three shared it
    assert fields["flags"] == MessageFlag.DELAY | MessageFlag.TTL
    assert [e.flags for e in entries] == [0, MessageFlag.DELAY, MessageFlag.TTL]
    props = decode_properties(entries[1].properties)
    assert props["a"] == "b" and int(props[DELIVER_AT_MS]) >= before_ms + 60_000
    assert decode_properties(entries[2].properties) == {TTL_MS: "5000"}
    assert [r.queue_offset for r in results] == [0, -1, 1]
    assert all(r.topic == "t" for r in results)


async def test_a_plain_batch_carries_no_flags_field() -> None:
    p = _producer("t")
    broker = FlagBroker()
    p._pool.request = broker.request  # type: ignore[method-assign]
    r = await p.send_and_wait("t", b"x")
    assert "flags" not in broker.sends[0][0] and r.queue_offset == 0


async def test_send_batch_with_delayed_messages() -> None:
    p = _producer("t")
    broker = FlagBroker()
    p._pool.request = broker.request  # type: ignore[method-assign]
    results = await p.send_batch("t", [Message(b"a"), Message(b"b", delay_ms=1000),
                                       Message(b"c", ttl_ms=10)])
    fields, entries = broker.sends[0]
    assert fields["flags"] == MessageFlag.DELAY | MessageFlag.TTL
    assert [e.flags for e in entries] == [0, MessageFlag.DELAY, MessageFlag.TTL]
    assert [r.queue_offset for r in results] == [0, -1, 1]
    with pytest.raises(InvalidDelayError):
        await p.send_batch("t", [Message(b"a"), Message(b"b", delay_ms=40 * DAY_MS)])
    assert len(broker.sends) == 1   # refused before anything was sent


async def test_producer_max_delay_option() -> None:
    p = _producer("t", max_delay_ms=1_000)
    p._pool.request = FlagBroker().request  # type: ignore[method-assign]
    with pytest.raises(InvalidDelayError, match="maximum"):
        await p.send("t", b"x", delay_ms=1_001)
    with pytest.raises(ValueError):
        await p.send("t", b"x", delay_ms=1, deliver_at_ms=int(time.time() * 1000) + 5)


async def test_cancel_delayed_maps_answers_and_follows_the_leader() -> None:
    known = {"A" * 32: 200, "B" * 32: 409, "C" * 32: 404, "D" * 32: 503}
    calls: list[str] = []

    async def follower(request: web.Request) -> web.Response:
        calls.append("follower")
        return web.json_response({"error": {"code": 2, "type": "BusyError",
                                            "message": "not the leader",
                                            "leader": f"127.0.0.1:{leader_port}"}}, status=503)

    async def leader(request: web.Request) -> web.Response:
        calls.append("leader")
        msg_id = request.match_info["msg_id"]
        status = known.get(msg_id, 404)
        if status == 503:   # being delivered right now: busy once, then delivered
            known[msg_id] = 409
            return web.json_response({"error": {"code": 2, "type": "BusyError",
                                                "message": "ask again"}}, status=503)
        if status == 200:
            return web.json_response({"cancelled": True})
        code, kind = (21, "AlreadyDeliveredError") if status == 409 else \
            (12, "MessageNotFoundError")
        return web.json_response({"error": {"code": code, "type": kind, "message": kind}},
                                 status=status)

    runners = []
    ports = []
    for handler in (follower, leader):
        app = web.Application()
        app.router.add_post("/v1/delayed/{msg_id}/cancel", handler)
        runner = web.AppRunner(app)
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        runners.append(runner)
        ports.append(port)
    follower_port, leader_port = ports
    try:
        p = _producer("t", delay_scheduler=f"127.0.0.1:{follower_port}")
        assert await p.cancel_delayed("a" * 32) is None
        assert calls == ["follower", "leader"]
        with pytest.raises(AlreadyDeliveredError):
            await p.cancel_delayed("B" * 32)
        with pytest.raises(MessageNotFoundError):
            await p.cancel_delayed("C" * 32)
        with pytest.raises(AlreadyDeliveredError):   # busy once (503), asked again: 409
            await p.cancel_delayed("D" * 32)
        with pytest.raises(MalformedRequestError):
            await p.cancel_delayed("not-an-id")
        await p._scheduler.close()
    finally:
        for runner in runners:
            await runner.cleanup()
