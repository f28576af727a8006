"""Bounds on what one request can make the broker hold: query bodies."""
from __future__ import annotations

import pytest
from ferry.store import iter_records
from ferry.wire import RequestCode
from ferry_broker.handlers.query import MAX_QUERY_BYTES

from tests.broker.conftest import Broker
from tests.broker.wire_client import WireClient, message

pytestmark = pytest.mark.integration


async def test_query_by_key_body_stops_at_the_byte_cap(client: WireClient) -> None:
    body = b"q" * (3 << 20)  # three of these exceed MAX_QUERY_BYTES, two do not
    assert 2 * len(body) < MAX_QUERY_BYTES < 3 * len(body)
    for _ in range(3):
        await client.send("big-query", 0, [message(body, keys="bulky")])
    resp = await client.call(RequestCode.QUERY_BY_KEY, {"topic": "big-query", "key": "bulky"})
    assert resp.fields["count"] == 2
    assert len(list(iter_records(resp.body))) == 2 and len(resp.body) <= MAX_QUERY_BYTES


async def test_stats_show_store_health(broker: Broker, client: WireClient) -> None:
    await client.send("stats-health", 0, [message(b"x")])
    store = broker.get_json("/v1/stats")["store"]
    assert store["healthy"] is True
    assert store["commit_log_max_offset"] > store["commit_log_min_offset"] >= 0
    assert 0 < store["disk_used_ratio"] <= 1 and store["flushed_offset"] >= 0
