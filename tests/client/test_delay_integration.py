"""Delayed retries and cancel against a real mesh with the delay scheduler running.

Skipped until the delay scheduler service (and its test fixture,
`tests.delay_scheduler.conftest.start_scheduler`) is present.
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest
from ferry.client import Admin, Consumer, ConsumerRecord, Producer
from ferry.errors import AlreadyDeliveredError

from tests.client.conftest import Mesh, start_mesh, unique
from tests.client.test_cli import ferry
from tests.client.util import FAST
from tests.support.procs import Etcd

pytest.importorskip("ferry_delay_scheduler.app", reason="the delay scheduler has not landed")
sched = pytest.importorskip("tests.delay_scheduler.conftest",
                            reason="the delay scheduler's test fixtures have not landed")

pytestmark = pytest.mark.integration

#: Clock granularity between the broker that stamps DELIVER_AT_MS and this process.
CLOCK_SLACK_S = 0.02


@pytest.fixture(scope="module")
def scheduled(etcd: Etcd, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Mesh, Any]]:
    mesh = start_mesh(etcd, tmp_path_factory.mktemp("sched-mesh"), ("broker-a",))
    try:
        scheduler = sched.start_scheduler(mesh, "sched-client")
    except BaseException:
        mesh.stop()
        raise
    yield mesh, scheduler
    scheduler.proc.stop()
    mesh.stop()


async def test_retries_wait_their_back_off(scheduled: tuple[Mesh, Any]) -> None:
    mesh, _ = scheduled
    topic, group = unique("backoff"), unique("g")
    async with Admin(namesrv=mesh.namesrv) as admin:
        await admin.create_group(group, retry_backoff_ms=[500, 1000], consume_from="earliest")
    async with Producer(namesrv=mesh.namesrv) as producer:
        await producer.send_and_wait(topic, b"callback")
    seen: list[tuple[float, int]] = []
    done = asyncio.Event()

    async def handler(rec: ConsumerRecord) -> None:
        seen.append((time.monotonic(), rec.reconsume_times))
        if len(seen) < 3:
            raise RuntimeError("try again later")
        done.set()

    async with Consumer(topic, group=group, namesrv=mesh.namesrv, **FAST) as consumer:
        task = asyncio.ensure_future(consumer.run(handler))
        await asyncio.wait_for(done.wait(), 30)
        await asyncio.sleep(2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert [n for _, n in seen] == [0, 1, 2]   # and once more only
    gaps = [b - a for (a, _), (b, _) in zip(seen, seen[1:], strict=False)]
    assert gaps[0] >= 0.5 - CLOCK_SLACK_S and gaps[1] >= 1.0 - CLOCK_SLACK_S   # never early


async def test_cancel_before_due_and_after_delivery(scheduled: tuple[Mesh, Any]) -> None:
    mesh, scheduler = scheduled
    topic, group = unique("cancel"), unique("g")
    async with Producer(namesrv=mesh.namesrv,
                        delay_scheduler=f"127.0.0.1:{scheduler.http_port}") as producer:
        doomed = await producer.send_and_wait(topic, b"cancelled", delay_ms=3_000)
        soon = await producer.send_and_wait(topic, b"delivered", delay_ms=300)
        await producer.cancel_delayed(doomed.msg_id)
        got: list[ConsumerRecord] = []
        async with Consumer(topic, group=group, namesrv=mesh.namesrv,
                            auto_offset_reset="earliest", **FAST) as consumer:
            deadline = time.monotonic() + 6   # well past the cancelled one's due time
            while time.monotonic() < deadline:
                for records in (await consumer.getmany(timeout_ms=300)).values():
                    got.extend(records)
        assert [r.msg_id for r in got] == [soon.msg_id]
        with pytest.raises(AlreadyDeliveredError):
            await producer.cancel_delayed(soon.msg_id)


def test_cli_send_delay_and_cancel(scheduled: tuple[Mesh, Any]) -> None:
    mesh, scheduler = scheduled
    topic = unique("clidelay")
    sent = ferry(mesh, "send", topic, "later", "--delay-ms", "2000")
    assert sent.returncode == 0, sent.stderr
    assert "delayed" in sent.stdout
    msg_id = sent.stdout.split()[1]
    cancelled = ferry(mesh, "delay", "cancel", msg_id, "--scheduler",
                      f"127.0.0.1:{scheduler.http_port}")
    assert cancelled.returncode == 0, cancelled.stderr
    assert f"cancelled {msg_id}" in cancelled.stdout
    consumed = ferry(mesh, "consume", topic, "--group", unique("g"), "--from", "earliest",
                     "--count", "1", "--timeout-ms", "5000")
    assert consumed.returncode == 3 and consumed.stdout == ""   # never arrives
