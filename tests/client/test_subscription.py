"""Consumer subscriptions without a broker: shapes, start-time validation, PULL and HEARTBEAT fields,
and the fetcher's position passing records the broker skipped."""
from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any, NamedTuple

import pytest
from ferry import Consumer, Sql
from ferry.client import Sql as ClientSql
from ferry.client.consuming.fetcher import FetchConfig, QueueFetcher
from ferry.client.consuming.rebalance import GroupMembership
from ferry.client.consuming.subscriptions import compile_subscriptions, subscription_specs
from ferry.client.core.message import TopicQueue
from ferry.client.core.namesrv import BrokerRoute
from ferry.errors import InvalidFilterError
from ferry.filter import Subscription

from tests.support.procs import free_port


def test_sql_is_exported_where_consumer_is() -> None:
    assert Sql is ClientSql


@pytest.mark.parametrize(("subscription", "tags", "want"), [
    (None, None, {"a": None, "b": None}),
    ("x || y", None, {"a": "x || y", "b": "x || y"}),
    (None, ["x", "y"], {"a": ["x", "y"], "b": ["x", "y"]}),
    (Sql("n > 1"), None, {"a": Sql("n > 1"), "b": Sql("n > 1")}),
    ({"a": Sql("n > 1")}, None, {"a": Sql("n > 1"), "b": None}),
])
def test_subscription_shapes(subscription: object, tags: object, want: dict[str, object]) -> None:
    assert subscription_specs(["a", "b"], subscription, tags) == want  # type: ignore[arg-type]


def test_bad_shapes_are_refused_when_built() -> None:
    with pytest.raises(ValueError, match="not both"):
        Consumer("a", group="g", subscription="x", tags="y")
    with pytest.raises(ValueError, match="not subscribed"):
        Consumer("a", group="g", subscription={"b": "x"})
    with pytest.raises(TypeError):
        Consumer("a", group="g", subscription=42)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        Consumer("a", group="g", subscription={"a": 42})  # type: ignore[dict-item]


def test_compiled_subscriptions_leave_out_topics_taking_everything() -> None:
    subs = compile_subscriptions({"a": "*", "b": "x||y", "c": Sql("n > 1"), "d": None})
    assert set(subs) == {"b", "c"}
    assert subs["b"].to_fields() == {"tags": ["x", "y"], "sql": None}
    assert subs["c"].to_fields() == {"tags": None, "sql": "n > 1"}


@pytest.mark.parametrize("expression", ["amount >", "a = 'x", "a IN ()", "(a = 1", "a BETWEEN 1"])
async def test_bad_expression_fails_at_start_before_any_network(expression: str) -> None:
    # nothing listens there: a network call would fail with a connection error instead
    consumer = Consumer("a", "b", group="g", namesrv=f"127.0.0.1:{free_port()}",
                        subscription={"b": Sql(expression)})
    with pytest.raises(InvalidFilterError) as info:
        await asyncio.wait_for(consumer.start(), 5)
    assert info.value.line >= 1 and info.value.column >= 1 and info.value.expected
    assert str(info.value.column) in str(info.value)
    assert not consumer.started


class _Frame(NamedTuple):
    fields: dict[str, Any]
    body: bytes = b""


class _Route:
    def broker_addr(self, name: str) -> str:
        return "127.0.0.1:1"

    def broker(self, name: str) -> BrokerRoute:
        return BrokerRoute(name=name, cluster="c", master="127.0.0.1:1", queues=1)


class _Routes:
    def cached(self, topic: str) -> _Route:
        return _Route()

    def invalidate(self, topic: str) -> None:
        pass


class _Pool:
    """Answers PULLs from a script and keeps what was asked."""

    def __init__(self, answers: list[dict[str, Any]]) -> None:
        self.answers = answers
        self.asked: list[Mapping[str, Any]] = []

    async def request(self, addr: str, code: object, fields: Mapping[str, Any],
                      body: bytes = b"", timeout_ms: int | None = None) -> _Frame:
        self.asked.append(dict(fields))
        return _Frame(self.answers.pop(0))


def _fetcher(pool: _Pool, config: FetchConfig, topic: str = "a") -> QueueFetcher:
    fetcher = QueueFetcher(tq=TopicQueue(topic, "broker-a", 0), pool=pool,  # type: ignore[arg-type]
                           routes=_Routes(), config=config,  # type: ignore[arg-type]
                           wakeup=asyncio.Event(), fetch_offset=10)
    fetcher._route_suspect = False
    return fetcher


@pytest.mark.parametrize("status", ["NO_MATCHED_MESSAGE", "OFFSET_OVERFLOW_ONE",
                                    "NO_MESSAGE_IN_QUEUE"])
async def test_fetcher_sends_its_filter_and_passes_skipped_records(status: str) -> None:
    config = FetchConfig(group="g")
    config.subscribe(compile_subscriptions({"a": Sql("n > 1"), "b": "x"}))
    pool = _Pool([{"status": status, "next_offset": 25}, {"status": status, "next_offset": 25}])
    fetcher = _fetcher(pool, config)
    assert await fetcher._pull_once() is False
    assert pool.asked[0]["sql"] == "n > 1" and pool.asked[0]["tags"] is None
    assert (fetcher.fetch_offset, fetcher.delivered) == (25, 25)
    assert await fetcher._pull_once() is False   # nothing new: the position stays
    assert (fetcher.fetch_offset, fetcher.delivered) == (25, 25)
    other = _fetcher(_Pool([{"status": "NO_MATCHED_MESSAGE", "next_offset": 10}]), config, "c")
    await other._pull_once()
    assert other.config.filter_fields("c") == {"tags": None, "sql": None}
    assert other.delivered == 10


class _Rec(NamedTuple):
    queue_offset: int


def test_skipped_offsets_behind_buffered_records_pass_when_those_are_taken() -> None:
    fetcher = _fetcher(_Pool([]), FetchConfig(group="g", prefetch_records=100))
    fetcher._push([_Rec(10), _Rec(11)], 12)   # type: ignore[list-item]
    fetcher._push([], 40)                     # the broker skipped 12..39
    assert fetcher.take(2) == [_Rec(10), _Rec(11)]
    assert fetcher.delivered == 40 and fetcher.buffered == 0


async def test_heartbeat_carries_subscriptions_but_not_the_retry_topic() -> None:
    consumer = Consumer("a", "b", group="g", namesrv=f"127.0.0.1:{free_port()}",
                        subscription={"a": "x || y"})
    consumer._subscribe()
    members: GroupMembership = consumer._assignment.members
    pool = _Pool([{}])
    members.pool = pool  # type: ignore[assignment]

    class _R:
        brokers = [type("B", (), {"master": "127.0.0.1:1"})()]

    await members.heartbeat([_R()])  # type: ignore[list-item]
    sent = pool.asked[0]
    assert sent["topics"] == ["a", "b", "%RETRY%g"]
    assert sent["subscriptions"] == {"a": {"tags": ["x", "y"], "sql": None}}
    assert Subscription.from_fields(**{f"{k}_field": v for k, v in
                                       sent["subscriptions"]["a"].items()}).tags == {"x", "y"}
    await consumer._pool.close()
    await consumer._namesrv.close()


async def test_heartbeat_of_a_consumer_taking_everything_says_so() -> None:
    """An empty map, not a missing field: the broker compares only members that said."""
    consumer = Consumer("a", group="g", namesrv=f"127.0.0.1:{free_port()}", subscription="*")
    consumer._subscribe()
    pool = _Pool([{}])
    consumer._assignment.members.pool = pool  # type: ignore[assignment]

    class _R:
        brokers = [type("B", (), {"master": "127.0.0.1:1"})()]

    await consumer._assignment.members.heartbeat([_R()])  # type: ignore[list-item]
    assert pool.asked[0]["subscriptions"] == {}
