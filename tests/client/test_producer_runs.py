"""The producer's fast path for plain messages, without processes: runs of plain sends,
their encoding and completion, the per-topic lane, and sampling by countdown.

The SEND requests go to the in-process broker stand-in of test_producer_unit.
"""
from __future__ import annotations

import asyncio
import statistics
import time

import pytest
from ferry.client.core.message import SendResult, TopicQueue
from ferry.client.core.namesrv import BrokerRoute, TopicRoute
from ferry.client.core.tracing import NEVER, sample_gap
from ferry.client.producing.pending import PendingRun, split_entries
from ferry.codec.entry import ENTRY_HEAD
from ferry.telemetry import Tracing
from ferry.wire import decode_messages

from tests.client.test_producer_unit import Broker, _close_producers, _producer, _route

__all__ = ["_close_producers"]   # the autouse fixture closing the stand-in producers
pytestmark = pytest.mark.usefixtures("_close_producers")


def _run(bodies: list[bytes], loop: asyncio.AbstractEventLoop) -> PendingRun:
    run = PendingRun(born_ts_ms=1_700_000_000_123)
    run.bodies = list(bodies)
    run.futures = [loop.create_future() for _ in bodies]
    return run


async def test_a_run_encodes_as_the_entry_layout_with_fresh_ids() -> None:
    run = _run([b"a", b"bb", b"bb", b"c" * 1000], asyncio.get_running_loop())
    body = b"".join(run.encode())
    decoded = decode_messages(body)
    assert [m.body for m in decoded] == run.bodies
    assert [m.msg_id for m in decoded] == run.msg_ids and len(set(run.msg_ids)) == 4
    assert all(m.born_ts_ms == run.born_ts_ms and m.flags == 0 for m in decoded)
    first = ENTRY_HEAD.pack(ENTRY_HEAD.size + 1, run.msg_ids[0], run.born_ts_ms, 0, 0, 0, 0, 1)
    assert body.startswith(first + b"a")
    assert run.encode() is run.parts   # made once: a retry keeps ids and bytes


async def test_completion_skips_a_cancelled_future_and_counts_its_offset() -> None:
    run = _run([b"x"] * 5, asyncio.get_running_loop())
    run.encode()
    run.futures[2].cancel()
    run.complete(TopicQueue("t", "b", 3), 3, 10)
    results = [f.result() for i, f in enumerate(run.futures) if i != 2]
    assert [r.queue_offset for r in results] == [10, 11, 13, 14]
    assert all(type(r) is SendResult and (r.topic, r.queue_id, r.broker) == ("t", 3, "b")
               for r in results)
    assert [r.msg_id for r in results] == [m.hex().upper() for i, m in enumerate(run.msg_ids)
                                           if i != 2]


async def test_a_failed_run_splits_into_messages_that_keep_their_ids() -> None:
    run = _run([b"one", b"two", b"three"], asyncio.get_running_loop())
    run.encode()
    run.futures[1].cancel()
    items = split_entries([run], "t")
    assert [it.wire.body for it in items] == [b"one", b"three"]   # the cancelled one is dropped
    assert [it.wire.msg_id for it in items] == [run.msg_ids[0], run.msg_ids[2]]
    assert [decode_messages(it.encoded)[0].body for it in items] == [b"one", b"three"]


async def test_plain_sends_go_round_robin_and_resolve_in_order() -> None:
    broker = Broker()
    p = _producer("t")
    p._pool.request = broker.request  # type: ignore[method-assign]
    futs = [await p.send("t", f"m{i}".encode()) for i in range(40)]
    assert all(isinstance(f, asyncio.Future) for f in futs)
    results = await asyncio.gather(*futs)
    assert len({(r.broker, r.queue_id) for r in results}) == 8   # 2 brokers x 4 queues
    assert len({r.msg_id for r in results}) == 40
    addr = {"broker-a": "127.0.0.1:1", "broker-b": "127.0.0.1:2"}
    for i, r in enumerate(results):   # each result names where its message was stored
        assert broker.queues[(addr[r.broker], r.queue_id)][r.queue_offset] == f"m{i}".encode()
    assert p.buffered_bytes == 0


async def test_a_new_route_entry_takes_effect_at_the_next_send() -> None:
    broker = Broker()
    p = _producer("t")
    p._pool.request = broker.request  # type: ignore[method-assign]
    await asyncio.gather(*[await p.send("t", b"x") for _ in range(8)])
    only_b = TopicRoute("t", "normal", "rw", (BrokerRoute("broker-b", "c", "127.0.0.1:2", 4),))
    p._routes._routes["t"] = (time.monotonic() + 3600, only_b)
    results = await asyncio.gather(*[await p.send("t", b"y") for _ in range(8)])
    assert {r.broker for r in results} == {"broker-b"}


async def test_a_broker_marked_faulty_is_skipped_by_plain_sends() -> None:
    broker = Broker()
    p = _producer("t")
    p._pool.request = broker.request  # type: ignore[method-assign]
    await asyncio.gather(*[await p.send("t", b"x") for _ in range(8)])   # the lane is built
    p._chooser.mark_faulty("broker-a")
    results = await asyncio.gather(*[await p.send("t", b"y") for _ in range(8)])
    assert {r.broker for r in results} == {"broker-b"}


async def test_a_stale_lane_is_dropped_and_the_route_asked_again() -> None:
    p = _producer("t", route_refresh_interval_ms=50)
    p._routes._routes["t"] = (time.monotonic(), _route("t"))
    asked: list[str] = []

    async def get_route(topic: str, *, create: bool = False) -> TopicRoute:
        asked.append(topic)
        return _route(topic)

    p._namesrv.get_route = get_route  # type: ignore[method-assign]
    p._pool.request = Broker().request  # type: ignore[method-assign]
    await (await p.send("t", b"x"))
    assert p._lanes.by_topic and not asked
    await asyncio.sleep(0.1)
    assert not p._lanes.by_topic          # its route went stale: the timer dropped it
    await (await p.send("t", b"y"))
    assert asked == ["t"]


def _tracing(ratio: float) -> Tracing:
    tr = Tracing()
    tr.enabled, tr.sample_ratio = True, ratio
    return tr


def test_sample_gaps_follow_the_geometric_law() -> None:
    assert sample_gap(_tracing(1.0)) == 0
    assert sample_gap(_tracing(0.0)) == NEVER and sample_gap(Tracing()) == NEVER
    gaps = [sample_gap(_tracing(0.1)) for _ in range(20_000)]
    assert min(gaps) == 0
    assert statistics.mean(gaps) == pytest.approx(9.0, rel=0.1)   # (1 - p) / p


async def test_sampling_traces_about_ratio_of_unforced_messages() -> None:
    p = _producer("t")
    p._tracing = _tracing(0.25)
    traced = sum(p._sampler.next() for _ in range(8_000))
    assert traced == pytest.approx(2_000, rel=0.1)
    picks = p._sampler.picks(8_000)
    assert len(picks) == pytest.approx(2_000, rel=0.1) and picks == sorted(set(picks))
    p._tracing = _tracing(1.0)   # a new tracing restarts the countdown
    assert p._sampler.picks(5) == [0, 1, 2, 3, 4]


async def test_forced_traces_do_not_consume_the_countdown() -> None:
    p = _producer("t")
    p._tracing = _tracing(0.5)
    p._sampler.left = 3
    p._pool.request = Broker().request  # type: ignore[method-assign]
    await (await p.send("t", b"x", trace=False))
    assert p._sampler.left == 3
    await (await p.send("t", b"x"))
    assert p._sampler.left == 2
