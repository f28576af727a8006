"""Retry bookkeeping without processes: the policy, pending positions, SEND_BACK, run().

The broker is an in-process stand-in that answers SEND_BACK (or fails it on
chosen addresses); records are built from real stored-record bytes.
"""
from __future__ import annotations

import asyncio
from typing import Any

import pytest
from ferry.client import Consumer
from ferry.client.consuming.retry import (
    DEFAULT_MAX_RECONSUME_TIMES,
    DEFAULT_RETRY_BACKOFF_MS,
    Nacker,
    PendingOffsets,
    RetryPolicy,
    SendBack,
    send_back_fields,
)
from ferry.client.consuming.runner import Runner
from ferry.client.core.message import ConsumerRecord, TopicQueue
from ferry.client.core.namesrv import BrokerRoute, TopicRoute
from ferry.client.core.records import decode_pull_body
from ferry.codec import ORIGIN_TOPIC
from ferry.errors import (
    ConnectionLostError,
    FerryError,
    InvalidDelayError,
    MessageNotFoundError,
)
from ferry.routing.models import GroupConfig
from ferry.store import MessageIn, encode_properties, encode_record
from ferry.wire import RequestCode

TQ = TopicQueue("orders", "broker-a", 1)


def _records(n: int, *, topic: str = "orders", reconsume_times: int = 0,
             props: dict[str, str] | None = None, first: int = 0) -> list[ConsumerRecord]:
    body = b"".join(
        encode_record(MessageIn(topic, 1, f"m{i}".encode(), tags="t", keys="k1 k2",
                                properties=encode_properties(props or {"p": "v"}),
                                born_ts_ms=1000 + i, born_host="10.0.0.5:5123",
                                reconsume_times=reconsume_times),
                      queue_offset=first + i, phy_offset=100 * i, store_ts_ms=2000,
                      store_host="10.0.0.1:10911")
        for i in range(n))
    return decode_pull_body(body, topic, "broker-a")


class FakeFrame:
    def __init__(self, fields: dict[str, Any]) -> None:
        self.fields = fields


class FakePool:
    """Answers SEND_BACK; addresses in `down` fail with ConnectionLostError, or `refuse`."""

    def __init__(self, down: set[str] | None = None,
                 refuse: FerryError | None = None) -> None:
        self.down = down or set()
        self.refuse = refuse
        self.calls: list[tuple[str, dict[str, Any], bytes]] = []
        self.gate: asyncio.Event | None = None   # when set: SEND_BACK waits for it

    async def request(self, addr: str, code: int, fields: dict[str, Any],
                      body: bytes = b"") -> FakeFrame:
        assert code == RequestCode.SEND_BACK
        self.calls.append((addr, dict(fields), body))
        if self.gate is not None:
            await self.gate.wait()
        if addr in self.down:
            raise ConnectionLostError("injected")
        if self.refuse is not None:
            raise self.refuse
        return FakeFrame({"target": f"%RETRY%{fields['group']}", "queue_offset": 0})


class FakeRoutes:
    def __init__(self) -> None:
        self.route_ = TopicRoute("orders", "normal", "rw", (
            BrokerRoute("broker-a", "c", "a:1", 4), BrokerRoute("broker-b", "c", "b:1", 4)))

    async def route(self, topic: str) -> TopicRoute:
        return self.route_

    def invalidate(self, topic: str) -> None:
        return None


def _nacker(pool: FakePool, **kw: Any) -> tuple[Nacker, PendingOffsets]:
    routes = FakeRoutes()
    pending = PendingOffsets()
    send_back = SendBack(pool, routes, "g")  # type: ignore[arg-type]
    return Nacker(send_back, pending, **kw), pending


def test_client_defaults_are_the_group_configs() -> None:
    cfg = GroupConfig("g")
    assert DEFAULT_RETRY_BACKOFF_MS == cfg.retry_backoff_ms
    assert DEFAULT_MAX_RECONSUME_TIMES == cfg.retry_max


def test_policy_from_group_config_and_options() -> None:
    policy = RetryPolicy.from_group(None)
    assert policy.delay_for(1) == 10_000 and policy.delay_for(99) == 7_200_000
    cfg = GroupConfig("g", retry_max=3, retry_backoff_ms=(5, 50)).to_dict()
    policy = RetryPolicy.from_group(cfg)
    assert (policy.max_reconsume_times, policy.delay_for(1), policy.delay_for(3)) == (3, 5, 50)
    policy = RetryPolicy.from_group({"max_reconsume_times": 4})
    assert policy.max_reconsume_times == 4
    policy = RetryPolicy.from_group(cfg, max_reconsume_times=2, retry_backoff_ms=[0])
    assert (policy.max_reconsume_times, policy.delay_for(7)) == (2, 0)
    with pytest.raises(ValueError):
        RetryPolicy.from_group(None, retry_backoff_ms=[])


def test_pending_offsets_clamp_commits() -> None:
    pending = PendingOffsets()
    assert pending.clamp(TQ, 10) == 10
    pending.add(TQ, 7)
    pending.add(TQ, 4)
    pending.add(TQ, 4)
    assert pending.clamp(TQ, 10) == 4 and pending.clamp(TQ, 3) == 3
    pending.discard(TQ, 4)
    assert pending.floor(TQ) == 4   # counted twice
    pending.discard(TQ, 4)
    assert pending.clamp(TQ, 10) == 7
    pending.discard(TQ, 7)
    pending.discard(TQ, 99)   # unknown: ignored
    assert pending.floor(TQ) is None and len(pending) == 0


def test_send_back_fields_name_the_stored_record() -> None:
    (rec,) = _records(1, topic="%RETRY%g", props={"a": "1", ORIGIN_TOPIC: "orders"}, first=7)
    shown = rec.with_topic("orders")
    fields = send_back_fields(shown, "g", reconsume_times=2, delay_ms=5, max_reconsume_times=3)
    assert fields == {"group": "g", "topic": "%RETRY%g", "queue_id": 1, "queue_offset": 7,
                      "msg_id": rec.msg_id, "reconsume_times": 2, "delay_ms": 5,
                      "max_reconsume_times": 3}


def test_retry_records_show_their_origin_topic() -> None:
    (rec,) = _records(1, topic="%RETRY%g", reconsume_times=2, props={ORIGIN_TOPIC: "orders"})
    shown = rec.with_topic(rec.properties[ORIGIN_TOPIC])
    assert (shown.topic, shown.stored_topic, shown.reconsume_times) == ("orders", "%RETRY%g", 2)
    assert shown.topic_queue == TopicQueue("%RETRY%g", "broker-a", 1)
    assert rec.stored_topic == rec.topic == "%RETRY%g"


async def test_nack_fields_and_pending_until_stored() -> None:
    pool = FakePool()
    nacker, pending = _nacker(pool, retry_backoff_ms=[100, 200])
    nacker.configure({"retry_max": 5})
    (rec,) = _records(1, reconsume_times=1, first=42)
    pool.gate = asyncio.Event()
    task = asyncio.ensure_future(nacker.nack(rec))
    await asyncio.sleep(0.01)
    assert pending.clamp(TQ, 100) == 42   # not stored yet: commits stop below it
    pool.gate.set()
    answer = await task
    assert answer["target"] == "%RETRY%g" and pending.floor(TQ) is None
    addr, fields, body = pool.calls[0]
    assert addr == "a:1" and body == b""
    assert fields == {"group": "g", "topic": "orders", "queue_id": 1, "queue_offset": 42,
                      "msg_id": rec.msg_id, "reconsume_times": 2, "delay_ms": 200,
                      "max_reconsume_times": 5}
    await nacker.nack(rec, delay_ms=0)
    assert pool.calls[-1][1]["delay_ms"] == 0
    with pytest.raises(InvalidDelayError):
        await nacker.nack(rec, delay_ms=-1)


async def test_a_refused_send_back_raises_at_once_and_stays_pending() -> None:
    pool = FakePool(refuse=MessageNotFoundError("no message"))
    nacker, pending = _nacker(pool)
    (rec,) = _records(1, first=3)
    with pytest.raises(MessageNotFoundError):
        await nacker.nack(rec)
    assert len(pool.calls) == 1 and pending.floor(TQ) == 3


async def test_send_back_is_retried_on_its_broker_until_stopped_and_stays_pending() -> None:
    pool = FakePool(down={"a:1"})
    nacker, pending = _nacker(pool)
    (rec,) = _records(1, first=9)
    task = asyncio.ensure_future(nacker.nack(rec))
    await asyncio.sleep(0.5)
    assert len(pool.calls) >= 3   # tried again, with back-off
    assert {c[0] for c in pool.calls} == {"a:1"}   # only the broker that stores it
    await nacker.close(grace_ms=0)
    with pytest.raises(FerryError):
        await task
    assert pending.floor(TQ) == 9   # never committed past it: it will be delivered again


class FakeConsumer:
    """Hands out prepared records through getmany(); nack is recorded."""

    def __init__(self, records: list[ConsumerRecord]) -> None:
        self.records = list(records)
        self.started = True
        self.nacked: list[ConsumerRecord] = []
        self.rewound: dict[TopicQueue, int] = {}

    async def getmany(self, timeout_ms: int = 0,
                      max_records: int | None = None) -> dict[TopicQueue, list[ConsumerRecord]]:
        take, self.records = self.records[:max_records], self.records[max_records:]
        if not take:
            await asyncio.sleep(timeout_ms / 1000)
            return {}
        return {TQ: take}

    async def nack(self, record: ConsumerRecord, delay_ms: int | None = None) -> None:
        self.nacked.append(record)

    async def rewind(self, tq: TopicQueue, offset: int) -> None:
        self.rewound[tq] = offset


async def test_run_commits_only_below_the_lowest_running_handler() -> None:
    records = _records(6)
    consumer = FakeConsumer(records)
    pending = PendingOffsets()
    release = {r.queue_offset: asyncio.Event() for r in records}
    seen: list[int] = []

    async def handler(rec: ConsumerRecord) -> None:
        seen.append(rec.queue_offset)
        await release[rec.queue_offset].wait()
        if rec.queue_offset == 2:
            raise RuntimeError("fails")

    runner = Runner(consumer, handler, 3, pending)  # type: ignore[arg-type]
    task = asyncio.ensure_future(runner.run())
    await asyncio.sleep(0.05)
    assert seen == [0, 1, 2]   # no more than 3 at once
    release[1].set()
    await asyncio.sleep(0.05)
    assert pending.clamp(TQ, 6) == 0 and seen == [0, 1, 2, 3]
    release[0].set()
    await asyncio.sleep(0.05)
    assert pending.clamp(TQ, 6) == 2
    release[2].set()   # fails: nacked, then done
    await asyncio.sleep(0.05)
    assert [r.queue_offset for r in consumer.nacked] == [2]
    assert pending.clamp(TQ, 6) == 3
    for ev in release.values():
        ev.set()
    await asyncio.sleep(0.05)
    assert pending.floor(TQ) is None and seen == list(range(6))
    consumer.started = False
    await asyncio.wait_for(task, 2)


async def test_cancelled_run_rewinds_to_the_lowest_unfinished() -> None:
    consumer = FakeConsumer(_records(4, first=10))
    pending = PendingOffsets()
    block = asyncio.Event()

    async def handler(rec: ConsumerRecord) -> None:
        if rec.queue_offset != 11:
            await block.wait()

    runner = Runner(consumer, handler, 4, pending)  # type: ignore[arg-type]
    task = asyncio.ensure_future(runner.run())
    await asyncio.sleep(0.05)
    assert pending.floor(TQ) == 10
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert consumer.rewound == {TQ: 10} and pending.floor(TQ) is None


async def test_consumer_commit_stops_below_pending_nacks() -> None:
    consumer = Consumer("orders", group="g", namesrv="127.0.0.1:1")
    committed: list[dict[TopicQueue, int]] = []

    class Store:
        async def commit(self, offsets: dict[TopicQueue, int]) -> None:
            committed.append(dict(offsets))

    consumer._positions.offsets = Store()  # type: ignore[assignment]
    consumer._positions.consumed[TQ] = 20
    consumer._pending.add(TQ, 12)
    await consumer._positions.commit_consumed()
    consumer._pending.discard(TQ, 12)
    await consumer._positions.commit_consumed()
    assert committed == [{TQ: 12}, {TQ: 20}]
    assert consumer._assignment.topics == ["orders", "%RETRY%g"]
    assert Consumer("orders", group="g", mode="broadcasting")._assignment.topics == ["orders"]
    await consumer._namesrv.close()
