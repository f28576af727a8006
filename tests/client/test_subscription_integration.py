"""Tag and SQL92 subscriptions on real brokers: exactly the matching messages, and lag 0 after."""
from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

import pytest
from ferry import Admin, Consumer, Producer, Sql

from tests.client.conftest import Mesh, unique
from tests.client.util import FAST, collect

pytestmark = pytest.mark.integration

COUNT = 60
CONCURRENT = 8   # consumers at once (each its own group, from the earliest offset)


@dataclass(frozen=True)
class Msg:
    """One sent message as the expected-results table sees it (None = no such property)."""

    i: int
    tag: str | None
    amount: int | None
    region: str | None
    vip: str | None
    score: float | None
    level: str
    keys: str

    @property
    def name(self) -> str:
        return f"user-{self.i:02d}"

    @property
    def num_level(self) -> int | None:
        return int(self.level) if self.level.isdigit() else None

    def properties(self) -> dict[str, str]:
        props = {"name": self.name, "level": self.level, "amount": self.amount,
                 "region": self.region, "vip": self.vip,
                 "score": None if self.score is None else f"{self.score:.2f}"}
        return {k: str(v) for k, v in props.items() if v is not None}


def _message(i: int) -> Msg:
    return Msg(i=i, tag=("created", "paid", "shipped", None)[i % 4],
               amount=i * 10 if i % 3 else None,
               region=("eu", "us", "asia")[(i // 3) % 3] if i % 5 != 4 else None,
               vip={0: "true", 1: "FALSE", 2: "maybe"}.get(i % 7),
               score=i / 4 if i % 2 == 0 else None,
               level="abc" if i % 10 == 0 else str(i % 4),
               keys=f"k{i} order-{i % 6}" if i % 2 == 0 else f"k{i}")


MESSAGES = [_message(i) for i in range(COUNT)]


def _is(value: str | None, text: str) -> bool:
    return value is not None and value.lower() == text


Pred = Callable[[Msg], bool]
# (expression, which messages it takes: TRUE only; UNKNOWN and FALSE skip)
SQL_CASES: list[tuple[str, Pred]] = [
    ("amount > 100", lambda m: m.amount is not None and m.amount > 100),
    ("100 < amount", lambda m: m.amount is not None and m.amount > 100),
    ("amount >= 100 AND amount <= 200", lambda m: m.amount is not None and 100 <= m.amount <= 200),
    ("amount BETWEEN 100 AND 200", lambda m: m.amount is not None and 100 <= m.amount <= 200),
    ("amount NOT BETWEEN 100 AND 200",
     lambda m: m.amount is not None and not 100 <= m.amount <= 200),
    ("amount = 150", lambda m: m.amount == 150),
    ("amount <> 150", lambda m: m.amount is not None and m.amount != 150),
    ("amount IN (10, 20, 40, 590)", lambda m: m.amount in (10, 20, 40, 590)),
    ("amount IS NULL", lambda m: m.amount is None),
    ("amount IS NOT NULL", lambda m: m.amount is not None),
    ("NOT (amount > 300)", lambda m: m.amount is not None and m.amount <= 300),
    ("region = 'eu'", lambda m: m.region == "eu"),
    ("region <> 'eu'", lambda m: m.region is not None and m.region != "eu"),
    ("NOT (region = 'eu')", lambda m: m.region is not None and m.region != "eu"),
    ("region IN ('eu', 'us')", lambda m: m.region in ("eu", "us")),
    ("region NOT IN ('eu', 'us')", lambda m: m.region == "asia"),
    ("region IN ('eu', NULL)", lambda m: m.region == "eu"),
    ("region NOT IN ('eu', NULL)", lambda m: False),
    ("region IS NULL", lambda m: m.region is None),
    ("amount > 100 AND region IN ('eu', 'us')",
     lambda m: m.amount is not None and m.amount > 100 and m.region in ("eu", "us")),
    ("amount > 300 OR region = 'asia'",
     lambda m: (m.amount is not None and m.amount > 300) or m.region == "asia"),
    ("(amount > 100 OR amount IS NULL) AND NOT (region = 'us')",
     lambda m: (m.amount is None or m.amount > 100) and m.region in ("eu", "asia")),
    ("vip = TRUE", lambda m: _is(m.vip, "true")),
    ("vip = FALSE", lambda m: _is(m.vip, "false")),
    ("vip", lambda m: _is(m.vip, "true")),
    ("NOT vip", lambda m: _is(m.vip, "false")),
    ("vip IS NULL", lambda m: m.vip is None),
    ("region = 'eu' OR vip", lambda m: m.region == "eu" or _is(m.vip, "true")),
    ("TAGS = 'paid'", lambda m: m.tag == "paid"),
    ("TAGS IN ('created', 'shipped')", lambda m: m.tag in ("created", "shipped")),
    ("TAGS IS NULL", lambda m: m.tag is None),
    ("amount > 100 and TAGS = 'paid'",
     lambda m: m.amount is not None and m.amount > 100 and m.tag == "paid"),
    ("KEYS CONTAINS 'order-1'", lambda m: "order-1" in m.keys),
    ("KEYS STARTSWITH 'k1'", lambda m: m.keys.startswith("k1")),
    ("name ENDSWITH '7'", lambda m: m.name.endswith("7")),
    ("name NOT CONTAINS '-1'", lambda m: "-1" not in m.name),
    ("name STARTSWITH 'user-0'", lambda m: m.name.startswith("user-0")),
    ("region CONTAINS 'u'", lambda m: m.region is not None and "u" in m.region),
    ("region NOT STARTSWITH 'e'", lambda m: m.region is not None and m.region[0] != "e"),
    ("score >= 5.5", lambda m: m.score is not None and m.score >= 5.5),
    ("score < 1", lambda m: m.score is not None and m.score < 1),
    ("level = 3", lambda m: m.num_level == 3),
    ("level > 1", lambda m: m.num_level is not None and m.num_level > 1),
    ("level = 'abc'", lambda m: m.level == "abc"),
    ("nothing = 'x'", lambda m: False),
    ("NOT (nothing = 'x')", lambda m: False),
    ("nothing IS NULL", lambda m: True),
]

TAG_CASES: list[tuple[str, Pred]] = [
    ("*", lambda m: True),
    ("paid", lambda m: m.tag == "paid"),
    ("created || paid", lambda m: m.tag in ("created", "paid")),
    (" shipped ||nope ", lambda m: m.tag == "shipped"),
    ("nope", lambda m: False),
]


async def _send_table(namesrv: str, topic: str) -> None:
    async with Admin(namesrv=namesrv) as admin:
        await admin.create_topic(topic, queues=2, brokers=["broker-a"])
    async with Producer(namesrv=namesrv) as producer:
        futs = [await producer.send(topic, str(m.i).encode(), key=m.keys.split()[0],
                                    keys=tuple(m.keys.split()[1:]), tags=m.tag,
                                    properties=m.properties()) for m in MESSAGES]
        await asyncio.gather(*futs)


@pytest.fixture(scope="module")
def filtered_topic(mesh: Mesh) -> str:
    """One topic holding MESSAGES, shared by the tables (each case reads it in its own group)."""
    topic = unique("filtered")
    asyncio.run(_send_table(mesh.namesrv, topic))
    return topic


async def _lag_reaches_zero(mesh: Mesh, consumer: Consumer, group: str, topic: str) -> None:
    """Commit until the group's lag on `topic` is 0 (the position passes skipped records)."""
    async with Admin(namesrv=mesh.namesrv) as admin:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 20
        while True:
            await consumer.getmany(timeout_ms=100)
            await consumer.commit()
            lags = await admin.group_lag(group, [topic])
            if lags and all(q.lag == 0 for q in lags):
                return
            assert loop.time() < deadline, f"lag never reached 0: {lags}"


async def _check(mesh: Mesh, topic: str, subscription: str | Sql, pred: Pred) -> None:
    want = sorted(m.i for m in MESSAGES if pred(m))
    group = unique("g")
    async with Consumer(topic, group=group, namesrv=mesh.namesrv, auto_offset_reset="earliest",
                        subscription=subscription, **FAST) as consumer:
        got = (await collect([consumer], len(want), timeout_s=20, settle_s=0.5))[0]
        assert sorted(int(r.body) for r in got) == want, subscription
        await _lag_reaches_zero(mesh, consumer, group, topic)


async def _check_all(mesh: Mesh, topic: str,
                     cases: list[tuple[str | Sql, Pred]]) -> None:
    for start in range(0, len(cases), CONCURRENT):
        await asyncio.gather(*(_check(mesh, topic, sub, pred)
                               for sub, pred in cases[start:start + CONCURRENT]))


async def test_sql_subscriptions_take_exactly_the_matching_messages(
        mesh: Mesh, filtered_topic: str) -> None:
    assert len(SQL_CASES) >= 30
    await _check_all(mesh, filtered_topic, [(Sql(e), p) for e, p in SQL_CASES])


async def test_tag_subscriptions_take_exactly_the_matching_messages(
        mesh: Mesh, filtered_topic: str) -> None:
    await _check_all(mesh, filtered_topic, [(e, p) for e, p in TAG_CASES])


async def test_several_topics_each_with_its_own_subscription(mesh: Mesh) -> None:
    topics = [unique("multi") for _ in range(3)]
    async with Producer(namesrv=mesh.namesrv) as producer:
        for topic in topics:
            futs = [await producer.send(topic, f"{topic}:{m.i}".encode(), tags=m.tag,
                                        properties=m.properties()) for m in MESSAGES[:24]]
            await asyncio.gather(*futs)
    subscription = {topics[0]: "paid", topics[1]: Sql("amount > 100 AND region <> 'us'")}
    want = sorted([f"{topics[0]}:{m.i}" for m in MESSAGES[:24] if m.tag == "paid"]
                  + [f"{topics[1]}:{m.i}" for m in MESSAGES[:24]
                     if m.amount is not None and m.amount > 100 and m.region in ("eu", "asia")]
                  + [f"{topics[2]}:{m.i}" for m in MESSAGES[:24]])
    group = unique("g")
    async with Consumer(*topics, group=group, namesrv=mesh.namesrv, auto_offset_reset="earliest",
                        subscription=subscription, **FAST) as consumer:
        got = (await collect([consumer], len(want), timeout_s=20, settle_s=0.5))[0]
        assert sorted(r.body.decode() for r in got) == want
        for topic in topics:
            await _lag_reaches_zero(mesh, consumer, group, topic)
