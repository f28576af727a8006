"""Disk pressure on a real broker: a filler file takes its disk past the high-water mark.

The data directory lives on a small tmpfs mounted for the test (root only; skipped
elsewhere), so the broker measures a filesystem the test can fill. Nothing a group
has not read is deleted, SENDs get the retriable DiskFullError while the alarm is up
(it shows in /v1/stats), and they succeed again once the filler is gone. Forced
deletion (the old rule) happens only with FERRY_BROKER_DISK_FORCE_DELETE.
"""
from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from ferry.codec import DELIVER_AT_MS, MessageFlag
from ferry.errors import DiskFullError
from ferry.names import SCHEDULE_TOPIC
from ferry.store import encode_properties
from ferry.wire import RequestCode, encode_messages

from tests.broker.conftest import Broker, start_broker
from tests.broker.wire_client import WireClient, message

pytestmark = [pytest.mark.integration, pytest.mark.slow]

MOUNT_MB = 160
BODY = b"d" * (60 << 10)
PER_QUEUE = 200  # 2 queues x 200 x 60 KiB: about 24 MiB, six 4 MiB segments
TOPIC = "dp"


@pytest.fixture
def mount(tmp_path: Path) -> Iterator[Path]:
    """A MOUNT_MB tmpfs at tmp_path/mnt, unmounted after the test."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root")
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={MOUNT_MB}m", "tmpfs", str(mnt)],
                         capture_output=True)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {res.stderr.decode(errors='replace')}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


@contextlib.asynccontextmanager
async def _loaded(workdir: Path, mnt: Path, delayed: int = 0,
                  **env: str) -> AsyncIterator[tuple[Broker, WireClient]]:
    """A broker on the tmpfs, `delayed` delayed messages (due in an hour: into
    `%SCHEDULE%` queue 0) first, then loaded (`_load`), and a client; closed after."""
    b = start_broker(workdir, None, data_dir=mnt / "data",
                     FERRY_BROKER_SEGMENT_BYTES=str(4 << 20),
                     FERRY_BROKER_MAX_MESSAGE_BYTES=str(64 << 10),
                     FERRY_BROKER_DISK_CHECK_INTERVAL_MS="200",
                     FERRY_BROKER_RETENTION_CHECK_INTERVAL_MS="300",
                     FERRY_BROKER_DISK_RETENTION_RATIO="0.6",
                     FERRY_BROKER_DISK_LOW_WATER_RATIO="0.7",
                     FERRY_BROKER_DISK_HIGH_WATER_RATIO="0.8", **env)
    try:
        c = await b.client()
        try:
            if delayed:
                await _send_delayed(c, delayed)
            await _load(c)
            yield b, c
        finally:
            await c.close()
    finally:
        b.proc.stop()


def _fill(mnt: Path, ratio: float) -> Path:
    """A filler file taking the tmpfs to `ratio` used."""
    usage = shutil.disk_usage(mnt)
    filler = mnt / "filler"
    size = int(ratio * usage.total) - usage.used
    with open(filler, "wb") as f:
        for _ in range(size >> 20):
            f.write(b"\0" * (1 << 20))
    return filler


async def _send_delayed(c: WireClient, n: int) -> None:
    msgs = [message(f"later-{i}".encode(), keys=f"later-{i}") for i in range(n)]
    due = str(int(time.time() * 1000) + 3_600_000)
    for m in msgs:
        m.flags = int(MessageFlag.DELAY)
        m.properties = encode_properties({DELIVER_AT_MS: due})
    await c.call(RequestCode.SEND, {"topic": TOPIC, "queue_id": 0,
                                    "flags": int(MessageFlag.DELAY)}, encode_messages(msgs))


async def _load(c: WireClient) -> None:
    """PER_QUEUE messages on queues 0 and 1; groups: `all` read everything, `half` has
    read queue 1 up to PER_QUEUE // 2, `none` has read nothing of queue 1."""
    for i in range(PER_QUEUE):
        for q in (0, 1):
            await c.send(TOPIC, q, [message(BODY, keys=f"{q}-{i}")])
    commits = [("all", 0, PER_QUEUE), ("all", 1, PER_QUEUE), ("half", 1, PER_QUEUE // 2)]
    for group, q, offset in commits:
        await c.call(RequestCode.COMMIT_OFFSET, {"group": group, "topic": TOPIC, "queue_id": q,
                                                 "offset": offset})


async def _wait_stats(b: Broker, pred, timeout_s: float = 20.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while True:
        stats = await asyncio.to_thread(b.get_json, "/v1/stats")
        if pred(stats):
            return stats
        assert time.monotonic() < deadline, stats["disk"]
        await asyncio.sleep(0.2)


async def test_disk_full_refuses_sends_and_deletes_nothing_unread(tmp_path: Path,
                                                                   mount: Path) -> None:
    async with _loaded(tmp_path, mount) as (b, c):
        assert (await asyncio.to_thread(b.get_json, "/v1/stats"))["disk"]["alarm"] is False
        filler = _fill(mount, 0.9)
        stats = await _wait_stats(b, lambda s: s["disk"]["alarm"])
        assert stats["disk"]["used_ratio"] >= stats["disk"]["high_water_ratio"] == 0.8
        with pytest.raises(DiskFullError) as err:
            await c.send(TOPIC, 0, [message(b"refused")])
        assert err.value.retriable and "disk" in str(err.value)
        # Retention runs several times under pressure (every disk check while the alarm
        # is up): it may take what every group passed, never what `half` has not read.
        await asyncio.sleep(3)
        stats = await _wait_stats(b, lambda s: s["store"]["commit_log_min_offset"] > 0)
        assert stats["disk"]["alarm"]  # what every group passed freed too little
        assert stats["disk"]["held_by_floor"]  # and `half` has not read the rest
        assert 0 < stats["topics"][TOPIC]["1"]["min_offset"] <= PER_QUEUE // 2
        got = await c.pull_all(TOPIC, 1, PER_QUEUE // 2, group="half", max_count=64)
        assert [m.keys for m in got] == [f"1-{i}" for i in range(PER_QUEUE // 2, PER_QUEUE)]
        assert all(m.body == BODY for m in got)
        # The filler goes: writes resume by themselves.
        filler.unlink()
        await _wait_stats(b, lambda s: not s["disk"]["alarm"])
        await c.send(TOPIC, 0, [message(b"accepted")])
        log = b.proc.log()
        assert log.count("disk alarm:") == 1 and log.count("disk alarm cleared") == 1


async def test_under_pressure_only_passed_segments_go(tmp_path: Path, mount: Path) -> None:
    """Everything read by every group, then pressure: the passed segments are deleted."""
    async with _loaded(tmp_path, mount) as (b, c):
        await c.call(RequestCode.COMMIT_OFFSET, {"group": "half", "topic": TOPIC,
                                                 "queue_id": 1, "offset": PER_QUEUE})
        filler = _fill(mount, 0.75)  # past the retention ratio, under the high-water mark
        stats = await _wait_stats(b, lambda s: s["topics"][TOPIC]["1"]["min_offset"] > 0)
        assert stats["disk"]["alarm"] is False
        await c.send(TOPIC, 0, [message(b"accepted")])  # writes were never refused
        filler.unlink()


async def test_forced_deletion_only_when_opted_in(tmp_path: Path, mount: Path) -> None:
    async with _loaded(tmp_path, mount, FERRY_BROKER_DISK_FORCE_DELETE="true") as (b, c):
        filler = _fill(mount, 0.9)
        # The old rule: the oldest segments go although `half` has not read them (from
        # the retention ratio on: a check in the middle of the filling may start it).
        await _wait_stats(b, lambda s: s["topics"][TOPIC]["1"]["min_offset"] > PER_QUEUE // 2)
        filler.unlink()


async def test_records_the_delay_scheduler_has_not_taken_are_kept(tmp_path: Path,
                                                                  mount: Path) -> None:
    """Internal readers count as groups: the scheduler's `%SCHEDULE%` offset holds the log."""
    async with _loaded(tmp_path, mount, delayed=20) as (b, c):
        # Every consumer group read everything; the scheduler took 5 of the 20 only (its
        # group as the delay scheduler commits it, ferry_delay_scheduler.ingest.GROUP).
        await c.call(RequestCode.COMMIT_OFFSET, {"group": "half", "topic": TOPIC,
                                                 "queue_id": 1, "offset": PER_QUEUE})
        await c.call(RequestCode.COMMIT_OFFSET, {"group": "ferry-delay-scheduler",
                                                 "topic": SCHEDULE_TOPIC, "queue_id": 0,
                                                 "offset": 5})
        filler = _fill(mount, 0.9)
        stats = await _wait_stats(b, lambda s: s["disk"]["alarm"] and s["disk"]["held_by_floor"])
        assert stats["store"]["commit_log_min_offset"] == 0
        assert stats["topics"][SCHEDULE_TOPIC]["0"]["min_offset"] == 0
        got = await c.pull_all(SCHEDULE_TOPIC, 0, 5, group="ferry-delay-scheduler")
        assert [m.keys for m in got] == [f"later-{i}" for i in range(5, 20)]
        # Taken in: what every reader passed may go.
        await c.call(RequestCode.COMMIT_OFFSET, {"group": "ferry-delay-scheduler",
                                                 "topic": SCHEDULE_TOPIC, "queue_id": 0,
                                                 "offset": 20})
        await _wait_stats(b, lambda s: s["store"]["commit_log_min_offset"] > 0)
        filler.unlink()
