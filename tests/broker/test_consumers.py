"""Heartbeats, the live consumer list of a group, UNREGISTER and expiry."""
from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from ferry.errors import MalformedRequestError
from ferry.wire import RequestCode

from tests.broker.conftest import start_broker
from tests.support.procs import Etcd

pytestmark = pytest.mark.integration


async def test_heartbeats_members_unregister_and_expiry(tmp_path: Path, etcd: Etcd) -> None:
    b = start_broker(tmp_path, etcd, FERRY_BROKER_CONSUMER_EXPIRY_MS="1500")
    try:
        c = await b.client()

        async def beat(cid: str, topics: list[str]) -> None:
            await c.call(RequestCode.HEARTBEAT, {"client_id": cid, "group": "cg",
                                                 "topics": topics, "mode": "clustering"})

        async def members(topic: str | None = "t") -> list[str]:
            resp = await c.call(RequestCode.GET_CONSUMERS, {"group": "cg", "topic": topic})
            return resp.fields["members"]

        await beat("c-2", ["t"])
        await beat("c-1", ["t", "u"])
        await beat("c-3", ["u"])
        assert await members() == ["c-1", "c-2"]
        assert await members(None) == ["c-1", "c-2", "c-3"]
        await c.call(RequestCode.UNREGISTER, {"client_id": "c-2", "group": "cg"})
        assert await members() == ["c-1"]
        # c-1 keeps beating, c-3 goes silent and expires.
        for _ in range(4):
            await asyncio.sleep(0.5)
            await beat("c-1", ["t", "u"])
        assert await members("u") == ["c-1"]
        assert b.get_json("/v1/stats")["consumers"] == {"cg": ["c-1"]}
        await c.close()
    finally:
        b.proc.stop()


async def test_get_consumers_reports_each_members_joined_ms(tmp_path: Path, etcd: Etcd) -> None:
    """GET_CONSUMERS carries `joined_ms` aligned with `members` (0 for an old client), so that
    every member can order the group by join time; a bad value is refused, the member kept."""
    b = start_broker(tmp_path, etcd)
    try:
        c = await b.client()
        base = {"group": "jg", "topics": ["t"], "mode": "clustering"}
        await c.call(RequestCode.HEARTBEAT, {**base, "client_id": "late", "joined_ms": 2_000})
        await c.call(RequestCode.HEARTBEAT, {**base, "client_id": "early", "joined_ms": 1_000})
        await c.call(RequestCode.HEARTBEAT, {**base, "client_id": "old"})  # no joined_ms
        resp = await c.call(RequestCode.GET_CONSUMERS, {"group": "jg", "topic": "t"})
        assert resp.fields["members"] == ["early", "late", "old"]
        assert resp.fields["joined_ms"] == [1_000, 2_000, 0]
        for bad in (-1, 2**62 + 1, "1000", 1.5, True):
            with pytest.raises(MalformedRequestError, match="joined_ms"):
                await c.call(RequestCode.HEARTBEAT, {**base, "client_id": "x", "joined_ms": bad})
        # a later heartbeat keeps the member and updates what it said
        await c.call(RequestCode.HEARTBEAT, {**base, "client_id": "old", "joined_ms": 3_000})
        resp = await c.call(RequestCode.GET_CONSUMERS, {"group": "jg", "topic": None})
        assert dict(zip(resp.fields["members"], resp.fields["joined_ms"], strict=True)) == {
            "early": 1_000, "late": 2_000, "old": 3_000}
        await c.close()
    finally:
        b.proc.stop()
