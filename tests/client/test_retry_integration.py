"""Retries, the dead-letter queue, delay and TTL against a real mesh (etcd, namesrv, brokers).

Back-off is 0 here (SEND_BACK with delay 0 stores the copy in %RETRY%<group>
at once), so these tests do not need the delay scheduler; the scheduler's
own tests cover delayed redelivery.
"""
from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from typing import Any

import pytest
from ferry.client import Admin, Consumer, ConsumerRecord, Message, Producer
from ferry.codec import ORIGIN_TOPIC
from ferry.errors import InvalidDelayError

from tests.client.conftest import Mesh, unique
from tests.client.test_cli import ferry
from tests.client.util import FAST

pytestmark = pytest.mark.integration

DAY_MS = 86_400_000


async def _run_until(consumer: Consumer, handler: Any, done: asyncio.Event,
                     timeout_s: float = 30.0, settle_s: float = 2.0) -> None:
    """Run `handler` until `done` is set, then `settle_s` more (to see extra deliveries)."""
    task = asyncio.ensure_future(consumer.run(handler, concurrency=4))
    try:
        await asyncio.wait_for(done.wait(), timeout_s)
        await asyncio.sleep(settle_s)
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_a_handler_that_fails_twice_sees_attempts_0_1_2_then_done(mesh: Mesh) -> None:
    topic, group = unique("retry"), unique("g")
    async with Admin(namesrv=mesh.namesrv) as admin:
        await admin.create_group(group, retry_backoff_ms=[0], consume_from="earliest")
    async with Producer(namesrv=mesh.namesrv) as producer:
        sent = await producer.send_and_wait(topic, b"pay", key="order-1", tags="t",
                                            properties={"p": "1"})
    calls: list[ConsumerRecord] = []
    done = asyncio.Event()

    async def handler(rec: ConsumerRecord) -> None:
        calls.append(rec)
        if len(calls) < 3:
            raise RuntimeError("payment service down")
        done.set()

    async with Consumer(topic, group=group, namesrv=mesh.namesrv, **FAST) as consumer:
        await _run_until(consumer, handler, done)
    assert [r.reconsume_times for r in calls] == [0, 1, 2]   # and consumed once more only
    assert {r.msg_id for r in calls} == {sent.msg_id}
    assert [r.topic for r in calls] == [topic] * 3   # retries show the topic they failed on
    assert [r.stored_topic for r in calls] == [topic, f"%RETRY%{group}", f"%RETRY%{group}"]
    assert all((r.body, r.key, r.tags, r.properties.get("p")) == (b"pay", "order-1", "t", "1")
               for r in calls)
    assert calls[1].properties[ORIGIN_TOPIC] == topic
    # Committed past everything: a new member of the group gets nothing again.
    async with Consumer(topic, group=group, namesrv=mesh.namesrv, **FAST) as again:
        await asyncio.sleep(2)
        assert await again.getmany(timeout_ms=1000) == {}


async def test_always_failing_goes_to_the_dlq_and_resend_brings_it_back_to_that_group(
        mesh: Mesh) -> None:
    topic, group, other = unique("dlq"), unique("g"), unique("other")
    async with Producer(namesrv=mesh.namesrv) as producer:
        sent = await producer.send_and_wait(topic, b"poison", key="k")
    opts = {**FAST, "auto_offset_reset": "earliest", "max_reconsume_times": 2,
            "retry_backoff_ms": [0]}
    calls: list[int] = []
    third = asyncio.Event()

    async def failing(rec: ConsumerRecord) -> None:
        calls.append(rec.reconsume_times)
        if len(calls) >= 3:
            third.set()
        raise RuntimeError("always fails")

    seen_other: list[ConsumerRecord] = []

    async def other_handler(rec: ConsumerRecord) -> None:
        seen_other.append(rec)

    async with Consumer(topic, group=group, namesrv=mesh.namesrv, **opts) as consumer, \
            Consumer(topic, group=other, namesrv=mesh.namesrv, **opts) as other_consumer:
        other_task = asyncio.ensure_future(other_consumer.run(other_handler))
        await _run_until(consumer, failing, third)
        assert calls == [0, 1, 2]   # the third failure went to %DLQ%<group>
        async with Admin(namesrv=mesh.namesrv) as admin:
            dead = await admin.dead_letters(group).messages()
        assert [r.msg_id for r in dead] == [sent.msg_id]
        assert dead[0].properties[ORIGIN_TOPIC] == topic and dead[0].reconsume_times == 3

        listed = ferry(mesh, "dlq", "list", group)
        assert listed.returncode == 0, listed.stderr
        assert sent.msg_id in listed.stdout and f"topic={topic}" in listed.stdout
        resent = ferry(mesh, "dlq", "resend", group, "--id", sent.msg_id)
        assert resent.returncode == 0, resent.stderr
        assert f"resent {sent.msg_id}" in resent.stdout

        back: list[ConsumerRecord] = []
        arrived = asyncio.Event()

        async def fixed(rec: ConsumerRecord) -> None:
            back.append(rec)
            arrived.set()

        await _run_until(consumer, fixed, arrived)
        other_task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await other_task
    assert [(r.msg_id, r.reconsume_times, r.topic) for r in back] == [(sent.msg_id, 0, topic)]
    assert [r.msg_id for r in seen_other] == [sent.msg_id]   # once: the resend is not its
    # --id leaves the DLQ listed; purge moves the group's DLQ offset to the end.
    assert sent.msg_id in ferry(mesh, "dlq", "list", group).stdout
    purged = ferry(mesh, "dlq", "purge", group)
    assert purged.returncode == 0 and "purged 1 message" in purged.stdout
    listed = ferry(mesh, "dlq", "list", group)
    assert listed.returncode == 0 and "total: 0" in listed.stdout
    missing = ferry(mesh, "dlq", "resend", group, "--id", sent.msg_id)   # purged: not listed
    assert missing.returncode == 1 and "not found" in missing.stderr
    never = ferry(mesh, "dlq", "list", unique("never"))   # a group with no DLQ at all
    assert never.returncode == 0 and "total: 0" in never.stdout, never.stderr


async def test_a_ttl_expired_message_is_never_delivered(mesh: Mesh) -> None:
    topic, group = unique("ttl"), unique("g")
    async with Producer(namesrv=mesh.namesrv) as producer:
        first = await producer.send_and_wait(topic, b"stale", ttl_ms=200,
                                             queue_selector=lambda qs, m: qs[0])
        await asyncio.sleep(0.6)
        await producer.send_and_wait(topic, b"fresh", queue_selector=lambda qs, m: qs[0])
        kept = await producer.send_and_wait(topic, b"long-lived", ttl_ms=600_000,
                                            queue_selector=lambda qs, m: qs[0])
    assert kept.queue_offset == first.queue_offset + 2
    async with Consumer(topic, group=group, namesrv=mesh.namesrv, auto_offset_reset="earliest",
                        **FAST) as consumer:
        got: list[bytes] = []
        deadline = time.monotonic() + 20
        while len(got) < 2 and time.monotonic() < deadline:
            for records in (await consumer.getmany(timeout_ms=500)).values():
                got.extend(r.body for r in records)
    assert got == [b"fresh", b"long-lived"]
    broker = mesh.brokers[first.broker]
    with urllib.request.urlopen(f"http://127.0.0.1:{broker.http_port}/v1/stats",
                                timeout=5) as resp:
        stats = json.loads(resp.read())
    assert stats["expired"].get(topic, 0) >= 1


async def test_delayed_sends_are_held_back_and_bad_delays_refused(mesh: Mesh) -> None:
    topic, group = unique("delay"), unique("g")
    async with Producer(namesrv=mesh.namesrv) as producer:
        with pytest.raises(InvalidDelayError, match="maximum"):
            await producer.send(topic, b"x", delay_ms=40 * DAY_MS)
        late = await producer.send_and_wait(topic, b"later", delay_ms=60_000)
        results = await producer.send_batch(topic, [
            Message(b"now"), Message(b"later-too", deliver_at_ms=int(time.time() * 1000) + 60_000),
            Message(b"now-too", ttl_ms=60_000)])
    assert (late.topic, late.queue_offset) == (topic, -1)
    assert [r.queue_offset >= 0 for r in results] == [True, False, True]
    assert results[2].queue_offset == results[0].queue_offset + 1
    async with Consumer(topic, group=group, namesrv=mesh.namesrv, auto_offset_reset="earliest",
                        **FAST) as consumer:
        got: list[bytes] = []
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            for records in (await consumer.getmany(timeout_ms=500)).values():
                got.extend(r.body for r in records)
    assert sorted(got) == [b"now", b"now-too"]   # the delayed ones are not here early
