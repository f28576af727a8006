"""The broker deletes expired commit-log segments by itself, and queues follow."""
from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from ferry.wire import RequestCode

from tests.broker.conftest import start_broker
from tests.broker.wire_client import message
from tests.support.procs import Etcd

pytestmark = pytest.mark.integration


async def test_expired_segments_are_deleted_and_pulls_move_past_them(
    tmp_path: Path, etcd: Etcd
) -> None:
    b = start_broker(tmp_path, etcd, FERRY_BROKER_SEGMENT_BYTES=str(6 << 20),
                     FERRY_BROKER_RETENTION_HOURS="0.0005",  # 1.8 s
                     FERRY_BROKER_RETENTION_CHECK_INTERVAL_MS="300")
    try:
        c = await b.client()
        body = b"r" * (512 << 10)
        for _ in range(40):  # 20 MiB: several 6 MiB segments
            await c.send("ret", 0, [message(body)])
        segments = tmp_path / "data" / "commitlog"
        before = sorted(p.name for p in segments.iterdir() if not p.name.endswith(".tmp"))
        assert len(before) >= 3
        deadline = time.monotonic() + 15
        while True:
            bounds = (await c.call(RequestCode.GET_MIN_MAX, {"topic": "ret", "queue_id": 0})).fields
            if bounds["min_offset"] > 0 or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.2)
        assert 0 < bounds["min_offset"] <= bounds["max_offset"] == 40
        after = sorted(p.name for p in segments.iterdir() if not p.name.endswith(".tmp"))
        assert after[-1] == before[-1]  # the segment being written is never deleted
        assert len(after) < len(before)
        # a consumer still at offset 0 is told where the queue starts now
        fields, _ = await c.pull("ret", 0, 0, max_wait_ms=0)
        assert fields["next_offset"] >= bounds["min_offset"]
        # and what remains is readable
        _, got = await c.pull("ret", 0, bounds["min_offset"], max_wait_ms=0)
        assert got and all(r.body == body for r in got)
        await c.close()
    finally:
        b.proc.stop()
