"""Per-topic retention on real processes: etcd, namesrv, a broker, the client's Admin.

The clock the test controls is the commit-log segments' modification time, which is
what retention reads: the test sets them two hours back (a topic keeping 1 h has
expired, the broker's default 72 h has not) instead of waiting an hour.
"""
from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from ferry import Admin, Consumer, Message, Producer
from ferry.errors import MalformedRequestError, TopicNotFoundError

from tests.client.conftest import Mesh, start_mesh, unique
from tests.client.util import FAST
from tests.support.procs import Etcd

pytestmark = pytest.mark.integration

HOUR_MS = 3_600_000
BODY = b"r" * (32 << 10)
PER_TOPIC = 60  # two topics x 60 x 32 KiB, interleaved: about four 1 MiB segments


def _segments(mesh: Mesh) -> list[Path]:
    log_dir = mesh.brokers["broker-a"].data_dir / "commitlog"
    return sorted(p for p in log_dir.iterdir() if p.name.isdigit())


def _age_segments(mesh: Mesh, hours: float) -> None:
    then = time.time() - hours * 3600
    for seg in _segments(mesh):
        os.utime(seg, (then, then))


async def _bounds(admin: Admin, topic: str) -> tuple[int, int]:
    (info,) = await admin.queue_infos(topic)
    return info.min_offset, info.max_offset


async def _wait_min_moves(admin: Admin, topic: str, timeout_s: float = 20.0) -> tuple[int, int]:
    deadline = time.monotonic() + timeout_s
    while True:
        low, high = await _bounds(admin, topic)
        if low > 0 or time.monotonic() > deadline:
            return low, high
        await asyncio.sleep(0.2)


async def _read_all(mesh: Mesh, topic: str) -> list[int]:
    """Queue offsets a new group reads from the earliest kept message to the end."""
    async with Consumer(topic, group=unique("g"), namesrv=mesh.namesrv,
                        auto_offset_reset="earliest", **FAST) as consumer:
        got: list[int] = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=500)
            got.extend(r.queue_offset for rs in batch.values() for r in rs)
            if got and got[-1] == PER_TOPIC - 1:
                break
        return got


@pytest.fixture
def mesh(etcd: Etcd, tmp_path: Path) -> Iterator[Mesh]:
    """One broker with 1 MiB segments and a retention run every 300 ms (this module's own)."""
    m = start_mesh(etcd, tmp_path / "mesh", ("broker-a",), broker_env={
        "FERRY_BROKER_SEGMENT_BYTES": str(1 << 20),
        "FERRY_BROKER_MAX_MESSAGE_BYTES": str(64 << 10),
        "FERRY_BROKER_RETENTION_CHECK_INTERVAL_MS": "300"})  # the default 72 h stays
    yield m
    m.stop()


async def test_a_topic_keeping_1h_loses_old_messages_the_default_topic_keeps(mesh: Mesh) -> None:
    short, keep = unique("short"), unique("keep")
    async with Admin(namesrv=mesh.namesrv) as admin:
        created = await admin.create_topic(short, queues=1, retention_ms=HOUR_MS)
        assert created["retention_ms"] == HOUR_MS and "retention_bytes" not in created
        await admin.create_topic(keep, queues=1)
        async with Producer(namesrv=mesh.namesrv) as producer:
            for _ in range(PER_TOPIC // 10):
                await producer.send_batch(short, [Message(BODY) for _ in range(10)])
                await producer.send_batch(keep, [Message(BODY) for _ in range(10)])
        before = _segments(mesh)
        assert len(before) >= 4
        _age_segments(mesh, 2)  # two hours old: past the topic's hour, not the broker's 72 h

        low, high = await _wait_min_moves(admin, short)
        assert 0 < low < high == PER_TOPIC  # the active segment's messages stay
        assert await _bounds(admin, keep) == (0, PER_TOPIC)
        assert _segments(mesh) == before  # the default topic still holds every segment
        assert await _read_all(mesh, keep) == list(range(PER_TOPIC))
        assert await _read_all(mesh, short) == list(range(low, PER_TOPIC))

        # Set the same hour on the other topic: nothing holds the old segments any more.
        updated = await admin.update_topic(keep, retention_ms=HOUR_MS)
        assert updated["retention_ms"] == HOUR_MS and updated["queues"] == 1
        low_keep, _ = await _wait_min_moves(admin, keep)
        assert low_keep > 0
        deadline = time.monotonic() + 20
        while len(_segments(mesh)) == len(before) and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        after = _segments(mesh)
        assert len(after) < len(before) and after[-1] == before[-1]  # never the active one
        # Back to the broker's retention: the field is gone from the config.
        reverted = await admin.update_topic(keep, retention_ms=None)
        assert "retention_ms" not in reverted


async def test_a_topic_keeping_longer_holds_shared_segments_size_bounds_a_queue(
        mesh: Mesh) -> None:
    short, long, plain, sized = (unique(n) for n in ("short", "long", "plain", "sized"))
    async with Admin(namesrv=mesh.namesrv) as admin:
        await admin.create_topic(short, queues=1, retention_ms=HOUR_MS)
        await admin.create_topic(long, queues=1, retention_ms=100 * HOUR_MS)
        await admin.create_topic(plain, queues=1)
        await admin.create_topic(sized, queues=1, retention_bytes=100_000)
        async with Producer(namesrv=mesh.namesrv) as producer:
            for _ in range(PER_TOPIC // 10):
                for topic in (short, long, plain):
                    await producer.send_batch(topic, [Message(BODY) for _ in range(10)])
            await producer.send_batch(sized, [Message(BODY) for _ in range(10)])
        before = _segments(mesh)
        _age_segments(mesh, 80)  # past the broker's 72 h, within the long topic's 100 h
        # The short topic's minimum moving says a run has happened (one run does it all).
        assert (await _wait_min_moves(admin, short))[0] > 0
        assert await _bounds(admin, long) == (0, PER_TOPIC)
        assert await _bounds(admin, plain) == (0, PER_TOPIC)  # it shares the long one's segments
        assert _segments(mesh) == before
        # Three 32 KiB records (with their headers) fit in 100,000 bytes, four do not.
        assert await _bounds(admin, sized) == (7, 10)
        assert await _read_all(mesh, long) == list(range(PER_TOPIC))

        await admin.update_topic(long, retention_ms=None)  # back to the broker's 72 h
        assert (await _wait_min_moves(admin, plain))[0] > 0
        assert (await _bounds(admin, long))[0] > 0
        deadline = time.monotonic() + 20
        while len(_segments(mesh)) == len(before) and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        assert len(_segments(mesh)) < len(before)


async def test_bad_retention_is_refused_and_namesrv_keeps_serving(mesh: Mesh) -> None:
    topic = unique("bad")
    async with Admin(namesrv=mesh.namesrv) as admin:
        for bad in ({"retention_ms": 0}, {"retention_ms": "1h"}, {"retention_ms": True},
                    {"retention_bytes": -1}, {"retention_bytes": 2**60},
                    {"retention_ms": 11 * 365 * 24 * HOUR_MS}):
            with pytest.raises(MalformedRequestError, match="retention_"):
                await admin.create_topic(topic, queues=1, **bad)
        assert topic not in {t["name"] for t in await admin.list_topics()}
        await admin.create_topic(topic, queues=1, retention_bytes=1 << 20)
        with pytest.raises(MalformedRequestError, match="retention_ms"):
            await admin.update_topic(topic, retention_ms=-5)
        with pytest.raises(TopicNotFoundError):
            await admin.update_topic(unique("missing"), retention_ms=HOUR_MS)
        (cfg,) = [t for t in await admin.list_topics() if t["name"] == topic]
        assert cfg["retention_bytes"] == 1 << 20 and "retention_ms" not in cfg
