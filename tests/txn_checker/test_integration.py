"""The txn-checker on real processes: checks, commits by check, discards, restarts.

A one-broker mesh per test, a txn-checker process with a short schedule, and
a producer played on a raw connection (fake_producer.py) that counts the
checks it receives and answers them as the test says.
"""
from __future__ import annotations

import asyncio
import time

import pytest

from tests.client.conftest import Mesh, unique
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
