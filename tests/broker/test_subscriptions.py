"""HEARTBEAT subscriptions against a real broker: checked, kept per member, and members
of one group that subscribe differently are reported (log and /v1/stats)."""
from __future__ import annotations

from typing import Any

import pytest
from ferry.errors import InvalidFilterError, InvalidNameError, MalformedRequestError
from ferry.wire import RequestCode

from tests.broker.conftest import Broker
from tests.broker.wire_client import WireClient

pytestmark = pytest.mark.integration


async def heartbeat(c: WireClient, client_id: str, group: str, topics: list[str],
                    subscriptions: Any = None, **extra: Any) -> None:
    fields = {"client_id": client_id, "group": group, "topics": topics, "mode": "clustering",
              **extra}  # extra may override the mode
    if subscriptions is not None:
        fields["subscriptions"] = subscriptions
    await c.call(RequestCode.HEARTBEAT, fields)


def conflicts(broker: Broker) -> dict[str, Any]:
    return broker.get_json("/v1/stats")["subscription_conflicts"]


def warnings_about(broker: Broker, group: str) -> int:
    return sum(1 for line in broker.proc.log().splitlines()
               if "subscribes differently" in line and f"group {group} " in line)


async def test_differing_members_are_listed_and_logged_once_per_change(
        broker: Broker, client: WireClient) -> None:
    sql = {"tags": None, "sql": "amount > 100"}
    await heartbeat(client, "c1", "gs", ["orders"], {"orders": sql})
    await heartbeat(client, "c2", "gs", ["orders"], {"orders": sql})
    assert "gs" not in conflicts(broker)
    await heartbeat(client, "c3", "gs", ["orders", "other"],
                    {"orders": {"tags": ["paid", "created"], "sql": None}})
    for _ in range(3):  # repeated heartbeats change nothing: one warning
        await heartbeat(client, "c3", "gs", ["orders", "other"],
                        {"orders": {"tags": ["created", "paid"], "sql": None}})
    assert conflicts(broker)["gs"] == {"orders": {
        "c1": {"tags": None, "sql": "amount > 100"},
        "c2": {"tags": None, "sql": "amount > 100"},
        "c3": {"tags": ["created", "paid"], "sql": None}}}
    assert warnings_about(broker, "gs") == 1
    # A member missing a topic's entry takes everything of it: c3 now agrees with nobody.
    await heartbeat(client, "c3", "gs", ["orders"], {})
    assert conflicts(broker)["gs"]["orders"]["c3"] == {"tags": None, "sql": None}
    assert warnings_about(broker, "gs") == 2
    # The odd one leaves: the group agrees again.
    await client.call(RequestCode.UNREGISTER, {"client_id": "c3", "group": "gs"})
    assert "gs" not in conflicts(broker)


async def test_old_clients_without_subscriptions_keep_working(broker: Broker,
                                                             client: WireClient) -> None:
    await heartbeat(client, "old", "gold", ["orders"])
    await heartbeat(client, "new", "gold", ["orders"], {"orders": {"tags": ["a"], "sql": None}})
    resp = await client.call(RequestCode.GET_CONSUMERS, {"group": "gold", "topic": "orders"})
    assert resp.fields["members"] == ["new", "old"]
    assert "gold" not in conflicts(broker)  # an unknown filter is not compared



async def test_broadcasting_members_may_differ(broker: Broker, client: WireClient) -> None:
    for cid, tags in (("x", ["a"]), ("y", ["b"])):
        await heartbeat(client, cid, "gcast", ["orders"], {"orders": {"tags": tags, "sql": None}},
                        mode="broadcasting")
    assert "gcast" not in conflicts(broker)


async def test_bad_subscriptions_are_refused(broker: Broker, client: WireClient) -> None:
    with pytest.raises(InvalidFilterError, match="column"):
        await heartbeat(client, "b1", "gbad", ["t"], {"t": {"tags": None, "sql": "a >"}})
    for bad in ({"t": {"tags": None, "sql": "a > 1", "extra": 1}}, {"t": "a > 1"},
                {"%%bad topic": None}, ["t"], {f"t{i}": None for i in range(1025)}):
        with pytest.raises((MalformedRequestError, InvalidFilterError, InvalidNameError)):
            await heartbeat(client, "b1", "gbad", ["t"], bad)
    with pytest.raises((MalformedRequestError, InvalidFilterError)):
        await heartbeat(client, "b1", "gbad", ["t"], {"t": {"tags": [1, 2], "sql": None}})
    resp = await client.call(RequestCode.GET_CONSUMERS, {"group": "gbad"})
    assert resp.fields["members"] == []  # nothing refused was recorded
    await heartbeat(client, "b1", "gbad", ["t"], {"t": {"tags": "*", "sql": "a > 1"}})
    resp = await client.call(RequestCode.GET_CONSUMERS, {"group": "gbad"})
    assert resp.fields["members"] == ["b1"]


async def test_stats_list_each_member_with_its_subscriptions(broker: Broker,
                                                             client: WireClient) -> None:
    """/v1/stats `members` (what the console's group page shows)."""
    await heartbeat(client, "m1", "gm", ["orders"], {"orders": {"tags": ["b", "a"], "sql": None}},
                    joined_ms=1234)
    await heartbeat(client, "m2", "gm", ["orders"])   # an old client: no subscriptions sent
    members = broker.get_json("/v1/stats")["members"]["gm"]
    assert members == [
        {"client_id": "m1", "topics": ["orders"], "mode": "clustering", "joined_ms": 1234,
         "subscriptions": {"orders": {"tags": ["a", "b"], "sql": None}}},
        {"client_id": "m2", "topics": ["orders"], "mode": "clustering", "joined_ms": 0,
         "subscriptions": None}]
