"""`consumer.run(..., consume_timeout_ms=)` against a real mesh (etcd, namesrv, two brokers).

A handler that hangs past the timeout gives its record back once (SEND_BACK, here
with back-off 0, so no delay scheduler is needed), its queue keeps moving, the
commit passes the record once the copy is stored, and whatever the late handler
does afterwards is ignored. Ordered runs retry a timed-out record in place.
"""
from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from ferry.client import Admin, Consumer, ConsumerRecord, Producer
from ferry.client.consuming.consume_timeout import (
    DEFAULT_CONSUME_TIMEOUT_MS,
    MAX_CONSUME_TIMEOUT_MS,
    check_consume_timeout,
)
from ferry.errors import TopicNotFoundError

from tests.client.conftest import Mesh, unique
from tests.client.util import FAST

pytestmark = pytest.mark.integration

TIMEOUT_MS = 1_000
HANG_S = 3_600.0   # far past the timeout: only the timeout ends it
OPTS: dict[str, Any] = {**FAST, "auto_offset_reset": "earliest", "retry_backoff_ms": [0]}


async def _send_in_order(mesh: Mesh, topic: str, bodies: list[bytes]) -> None:
    """All on one queue (one key, ordered), in this order."""
    async with Producer(namesrv=mesh.namesrv) as producer:
        for body in bodies:
            await producer.send_and_wait(topic, body, key="one-queue", ordered=True)


async def _until(check: Callable[[], bool], timeout_s: float = 30.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not check():
            await asyncio.sleep(0.05)


async def _running(consumer: Consumer, handler: Callable[[ConsumerRecord], Awaitable[None]],
                   **run: Any) -> asyncio.Task[None]:
    return asyncio.ensure_future(consumer.run(handler, **run))


async def _stop(task: asyncio.Task[None]) -> None:
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def _lag(mesh: Mesh, group: str, topic: str) -> int:
    async with Admin(namesrv=mesh.namesrv) as admin:
        return sum(q.lag for q in await admin.group_lag(group, [topic, f"%RETRY%{group}"]))


async def _retry_copies(mesh: Mesh, group: str) -> int:
    """How many copies the group's retry topic holds (0: none was ever stored)."""
    async with Admin(namesrv=mesh.namesrv) as admin:
        try:
            queues = await admin.queue_infos(f"%RETRY%{group}")
        except TopicNotFoundError:
            return 0
        return sum(q.max_offset - q.min_offset for q in queues)


async def test_a_hung_handler_is_sent_back_after_the_timeout_and_the_queue_moves_on(
        mesh: Mesh) -> None:
    topic, group = unique("ctimeout"), unique("g")
    await _send_in_order(mesh, topic, [b"hang", b"a", b"b", b"c"])
    calls: list[tuple[bytes, int]] = []
    hangs: list[asyncio.Future[None]] = []

    async def handler(rec: ConsumerRecord) -> None:
        calls.append((rec.body, rec.reconsume_times))
        if (rec.body, rec.reconsume_times) == (b"hang", 0):
            hangs.append(asyncio.ensure_future(asyncio.sleep(HANG_S)))
            await hangs[-1]   # cancelled with the handler

    want = {(b"hang", 0), (b"a", 0), (b"b", 0), (b"c", 0), (b"hang", 1)}
    async with Consumer(topic, group=group, namesrv=mesh.namesrv, **OPTS) as consumer:
        # concurrency 1: without the timeout the hung handler would hold the only slot
        task = await _running(consumer, handler, concurrency=1, consume_timeout_ms=TIMEOUT_MS)
        try:
            await _until(lambda: want <= set(calls))
            await asyncio.sleep(1.0)   # the runner asks for more: positions promoted
            # The queue's commit passed everything, the hung record included.
            await consumer.commit()
            assert await _lag(mesh, group, topic) == 0
        finally:
            await _stop(task)
    assert sorted(calls) == sorted(want)   # each once: the hung one once more, as a retry
    assert calls[0] == (b"hang", 0) and calls[-1] == (b"hang", 1)
    assert len(hangs) == 1 and hangs[0].cancelled()   # the late handler was cancelled
    assert await _retry_copies(mesh, group) == 1
    async with Consumer(topic, group=group, namesrv=mesh.namesrv, **OPTS) as again:
        await asyncio.sleep(2)
        assert await again.getmany(timeout_ms=1000) == {}   # nothing left uncommitted


async def test_a_late_handler_that_ignores_the_cancel_is_ignored_and_sent_back_once(
        mesh: Mesh) -> None:
    """The first handler swallows the cancellation, goes on, then raises: its slot was
    freed at the timeout, the commit moved on while it still ran, and its late failure
    sends nothing back (one retry copy); a late return of the retry's handler neither."""
    topic, group = unique("ctlate"), unique("g")
    await _send_in_order(mesh, topic, [b"stubborn", b"next"])
    calls: list[tuple[bytes, int]] = []
    late_release = asyncio.Event()
    late_done = asyncio.Event()

    async def handler(rec: ConsumerRecord) -> None:
        calls.append((rec.body, rec.reconsume_times))
        if rec.body == b"stubborn" and rec.reconsume_times == 0:
            try:
                await asyncio.sleep(HANG_S)
            except asyncio.CancelledError:
                await late_release.wait()   # swallowed: it keeps running
            late_done.set()
            raise RuntimeError("failed late")

    async with Consumer(topic, group=group, namesrv=mesh.namesrv, **OPTS) as consumer:
        task = await _running(consumer, handler, concurrency=1, consume_timeout_ms=TIMEOUT_MS)
        try:
            await _until(lambda: {(b"next", 0), (b"stubborn", 1)} <= set(calls))
            assert not late_done.is_set()   # the first handler still runs ...
            await consumer.commit()
            assert await _lag(mesh, group, topic) == 0   # ... and the commit passed it
            late_release.set()
            await _until(late_done.is_set)
            await asyncio.sleep(1.5)   # room for a wrong second send-back to come back
        finally:
            late_release.set()   # (a failing run must not leave the handler waiting)
            await _stop(task)
    assert sorted(calls) == [(b"next", 0), (b"stubborn", 0), (b"stubborn", 1)]
    assert await _retry_copies(mesh, group) == 1


async def test_ordered_run_retries_a_timed_out_record_in_place(mesh: Mesh) -> None:
    topic, group = unique("ctorder"), unique("g")
    await _send_in_order(mesh, topic, [b"first", b"hang", b"after"])
    calls: list[tuple[bytes, int]] = []

    async def handler(rec: ConsumerRecord) -> None:
        calls.append((rec.body, rec.reconsume_times))
        if rec.body == b"hang" and rec.reconsume_times < 2:
            await asyncio.sleep(HANG_S)

    async with Consumer(topic, group=group, namesrv=mesh.namesrv, ordered=True,
                        suspend_ms=100, **OPTS) as consumer:
        task = await _running(consumer, handler, consume_timeout_ms=TIMEOUT_MS)
        try:
            await _until(lambda: (b"after", 0) in calls)
        finally:
            await _stop(task)
    # Nothing overtakes the timed-out record: tried again in place, then the next one.
    assert calls == [(b"first", 0), (b"hang", 0), (b"hang", 1), (b"hang", 2), (b"after", 0)]
    assert await _retry_copies(mesh, group) == 0   # no send-back: ordered retries locally


@pytest.mark.parametrize("bad", [0, -1, MAX_CONSUME_TIMEOUT_MS + 1, 1.5, "60000", True])
async def test_a_bad_consume_timeout_is_refused_and_the_consumer_keeps_working(
        mesh: Mesh, bad: Any) -> None:
    topic, group = unique("ctbad"), unique("g")
    await _send_in_order(mesh, topic, [b"x"])
    seen: list[bytes] = []

    async def handler(rec: ConsumerRecord) -> None:
        seen.append(rec.body)

    async with Consumer(topic, group=group, namesrv=mesh.namesrv, **OPTS) as consumer:
        with pytest.raises(ValueError, match="consume_timeout_ms"):
            await consumer.run(handler, consume_timeout_ms=bad)
        task = await _running(consumer, handler)
        try:
            await _until(lambda: seen == [b"x"])
        finally:
            await _stop(task)


def test_the_default_is_rocketmqs_fifteen_minutes_and_none_turns_it_off() -> None:
    import inspect

    assert DEFAULT_CONSUME_TIMEOUT_MS == 900_000
    assert inspect.signature(Consumer.run).parameters["consume_timeout_ms"].default == 900_000
    assert check_consume_timeout(None) is None
    assert check_consume_timeout(1_500) == 1.5
