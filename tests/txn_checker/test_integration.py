"""The txn-checker on real processes: checks, commits by check, discards, restarts.

A one-broker mesh per test, a txn-checker process with a short schedule, and
a producer played on a raw connection (fake_producer.py) that counts the
checks it receives and answers them as the test says.
"""
from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from ferry.client.core.connection import ConnectionPool
from ferry.codec import TXN_ACTION, TXN_ID, iter_records
from ferry.names import HALF_TOPIC, OP_TOPIC
from ferry.wire import RequestCode

from tests.client.conftest import Mesh, start_mesh, unique
from tests.support.procs import Etcd
from tests.txn_checker.conftest import FAST_SCHEDULE, start_txn_checker
from tests.txn_checker.fake_producer import FakeProducer

pytestmark = pytest.mark.integration


async def until(check, timeout_s: float = 30.0, what: str = "condition"):  # noqa: ANN001, ANN201
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not met within {timeout_s}s")
        await asyncio.sleep(0.05)


def _state(checker, msg_id: str) -> str | None:  # noqa: ANN001
    status, body = checker.get(f"/v1/transactions/{msg_id}")
    return body.get("state") if status == 200 else None


async def test_unknown_three_times_then_commit(txn_mesh: Mesh) -> None:
    group, topic = unique("tg"), unique("tt")
    checker = start_txn_checker(txn_mesh, env=FAST_SCHEDULE | {
        "FERRY_TXN_CHECKER_MAX_CHECKS": "10"})
    producer = await FakeProducer(txn_mesh.brokers["broker-a"].addr, group,
                                  lambda _id, n: "commit" if n >= 4 else None).start()
    try:
        msg_id = await producer.begin(topic, b"order-42")
        await until(lambda: producer.ended.get(msg_id), 40, "commit by check")
        assert producer.ended[msg_id] == "committed"
        assert producer.checks[msg_id] == 4
        stats = await until(lambda: (s := checker.stats())["committed_by_check"] == 1 and s,
                            20, "committed_by_check counted")
        assert stats["open"] == 0 and stats["discarded"] == 0
        assert _state(checker, msg_id) == "committed"
        await asyncio.sleep(2.5)  # two more intervals: no check after the commit
        assert producer.checks[msg_id] == 4
        # For operators: the group's committed offsets say nothing is left below them.
        addr = txn_mesh.brokers["broker-a"].addr
        assert await _committed_offset(addr, HALF_TOPIC) == 1
        assert await _committed_offset(addr, OP_TOPIC) == 1
    finally:
        await producer.stop()
        checker.proc.stop()


async def test_always_unknown_is_discarded(txn_mesh: Mesh) -> None:
    group, topic = unique("tg"), unique("tt")
    checker = start_txn_checker(txn_mesh, env=FAST_SCHEDULE)
    producer = await FakeProducer(txn_mesh.brokers["broker-a"].addr, group,
                                  lambda _id, _n: None).start()
    try:
        msg_id = await producer.begin(topic, b"never-decided")
        await until(lambda: _state(checker, msg_id) == "discarded", 40, "discarded")
        assert producer.checks[msg_id] == 3
        status, listed = checker.get("/v1/transactions?state=discarded")
        assert status == 200 and [t["msg_id"] for t in listed["transactions"]] == [msg_id]
        assert listed["transactions"][0]["group"] == group
        # The broker says it ended as a rollback: the producer's late commit is refused.
        with pytest.raises(Exception, match="rolled back"):
            await producer.end(msg_id, "commit")
        stats = await until(lambda: (s := checker.stats())["discarded"] == 1 and s, 20,
                            "discarded counted")
        assert stats["open"] == 0
        # After a restart the list is still there (it is in the checkpoint).
        checker.proc.stop()
        checker = start_txn_checker(txn_mesh, http_port=checker.http_port, env=FAST_SCHEDULE)
        assert _state(checker, msg_id) == "discarded"
    finally:
        await producer.stop()
        checker.proc.stop()


async def test_commit_just_before_immunity_ends_is_never_checked(txn_mesh: Mesh) -> None:
    group, topic = unique("tg"), unique("tt")
    immunity_ms = 1500
    checker = start_txn_checker(txn_mesh, env=FAST_SCHEDULE | {
        "FERRY_TXN_CHECKER_CHECK_IMMUNITY_MS": str(immunity_ms)})
    producer = await FakeProducer(txn_mesh.brokers["broker-a"].addr, group,
                                  lambda _id, _n: "rollback").start()
    try:
        ids = []
        for i in range(5):
            started = time.monotonic()
            msg_id = await producer.begin(topic, b"late-%d" % i)
            await asyncio.sleep(max(0.0, immunity_ms / 1000 - 0.15
                                    - (time.monotonic() - started)))
            assert (await producer.end(msg_id, "commit"))["state"] == "committed"
            ids.append(msg_id)
        await until(lambda: checker.stats()["committed_by_producer"] == 5, 20, "ops read")
        await asyncio.sleep(2 * immunity_ms / 1000)
        assert sum(producer.checks.values()) == 0
        assert checker.stats()["open"] == 0
    finally:
        await producer.stop()
        checker.proc.stop()


async def _committed_offset(addr: str, topic: str) -> int:
    pool = ConnectionPool()
    try:
        resp = await pool.request(addr, RequestCode.QUERY_OFFSET, {
            "group": "ferry-txn-checker", "topic": topic, "queue_id": 0})
        return int(resp.fields["offset"])
    finally:
        await pool.close()


async def _pull_all(addr: str, topic: str) -> list:
    """Every record of queue 0 of `topic` on the broker at `addr`."""
    pool = ConnectionPool()
    out: list = []
    offset = 0
    try:
        while True:
            resp = await pool.request(addr, RequestCode.PULL, {
                "group": "kill-test", "topic": topic, "queue_id": 0, "offset": offset,
                "max_count": 1000, "max_wait_ms": 0, "tags": None, "sql": None})
            if resp.fields.get("status") != "FOUND":
                return out
            out += list(iter_records(resp.body))
            offset = int(resp.fields["next_offset"])
    finally:
        await pool.close()


async def test_kill9_of_checker_and_broker_ends_every_transaction_exactly_once(
        txn_mesh: Mesh) -> None:
    group, topic = unique("tg"), unique("tt")
    env = FAST_SCHEDULE | {"FERRY_TXN_CHECKER_MAX_CHECKS": "3"}
    checker = start_txn_checker(txn_mesh, env=env)
    expect: dict[str, str] = {}

    def answer(msg_id: str, n: int) -> str | None:
        want = expect[msg_id]
        return want if want in ("commit", "rollback") and n >= 2 else None

    broker = txn_mesh.brokers["broker-a"]
    producer = await FakeProducer(broker.addr, group, answer).start()
    try:
        for i in range(24):
            msg_id = await producer.begin(topic, b"txn-%d" % i)
            expect[msg_id] = ("commit", "rollback", "discard")[i % 3]
        await asyncio.sleep(1.6)  # the first checks are under way
        checker.proc.kill9()
        checker = start_txn_checker(txn_mesh, http_port=checker.http_port, env=env)
        await asyncio.sleep(1.2)
        broker.proc.kill9()
        broker = txn_mesh.start_broker("broker-a")
        await until(lambda: checker.stats()["open"] == 0, 60, "every transaction resolved")
        ops = await _pull_all(broker.addr, OP_TOPIC)
        ended: dict[str, list[str]] = {}
        for rec in ops:
            ended.setdefault(rec.properties[TXN_ID], []).append(rec.properties[TXN_ACTION])
        assert set(ended) == set(expect)
        for msg_id, want in expect.items():
            assert ended[msg_id] == ["rollback" if want == "discard" else want], msg_id
        committed = [r.msg_id_hex for r in await _pull_all(broker.addr, topic)]
        assert sorted(committed) == sorted(i for i, w in expect.items() if w == "commit")
        status, listed = checker.get("/v1/transactions?state=discarded")
        assert {t["msg_id"] for t in listed["transactions"]} == {
            i for i, w in expect.items() if w == "discard"}
    finally:
        await producer.stop()
        checker.proc.stop()


async def test_halves_on_every_broker_of_the_route_are_checked(
        etcd: Etcd, tmp_path: Path) -> None:
    mesh = start_mesh(etcd, tmp_path / "mesh", ("broker-a", "broker-b"))
    group, topic = unique("tg"), unique("tt")
    producers: list[FakeProducer] = []
    checker = start_txn_checker(mesh, env=FAST_SCHEDULE)
    try:
        ids = {}
        for name, broker in mesh.brokers.items():
            producer = await FakeProducer(broker.addr, group,
                                          lambda _id, n: "commit" if n >= 1 else None).start()
            producers.append(producer)
            ids[name] = await producer.begin(topic, name.encode())
        await until(lambda: checker.stats()["committed_by_check"] == 2, 40,
                    "a commit by check on each broker")
        stats = checker.stats()
        assert set(stats["brokers"]) == {"broker-a", "broker-b"} and stats["open"] == 0
        for name, msg_id in ids.items():
            status, txn = checker.get(f"/v1/transactions/{msg_id}")
            assert status == 200 and (txn["state"], txn["broker"]) == ("committed", name)
    finally:
        for producer in producers:
            await producer.stop()
        checker.proc.stop()
        mesh.stop()
