"""Two txn-checkers, one leader: no check twice, nothing lost with the leader's machine.

Real etcd, namesrv, broker and txn-checker processes. Producers are played on
raw connections (fake_producer.py), counting the checks they receive; the
outcome is read from the broker: the op records of %OP% (one per transaction)
and the real messages of the topic (one per committed transaction).
"""
from __future__ import annotations

import asyncio
import os
import shutil
import signal
import time

import pytest
from ferry.codec import TXN_ACTION, TXN_BY, TXN_ID
from ferry.names import OP_TOPIC

from tests.client.conftest import Mesh, unique
from tests.txn_checker.conftest import FAST_SCHEDULE, TxnCheckerProc, start_txn_checker
from tests.txn_checker.fake_producer import FakeProducer
from tests.txn_checker.test_integration import _pull_all, until

pytestmark = pytest.mark.integration

LEADER_TTL = {"FERRY_TXN_CHECKER_LEADER_TTL_S": "3"}


def _role(checker: TxnCheckerProc) -> str | None:
    try:
        return str(checker.stats()["role"])
    except Exception:  # noqa: BLE001 - killed or not answering yet
        return None


async def _one_leader(*checkers: TxnCheckerProc) -> tuple[TxnCheckerProc, TxnCheckerProc]:
    """(leader, standby) once exactly one of two leads."""
    await until(lambda: sorted(str(_role(c)) for c in checkers) == ["leader", "standby"],
                30, "one leader and one standby")
    leader = next(c for c in checkers if _role(c) == "leader")
    return leader, next(c for c in checkers if c is not leader)


async def _two_checkers(mesh: Mesh, env: dict[str, str]
                        ) -> tuple[list[TxnCheckerProc], FakeProducer]:
    """Two checkers, and a producer of a new group that never decides."""
    checkers = [start_txn_checker(mesh, f"checker-{i}", env=env) for i in (1, 2)]
    addr = mesh.brokers["broker-a"].addr
    return checkers, await FakeProducer(addr, unique("tg"), lambda _id, _n: None).start()


async def _ops(addr: str) -> dict[str, list[tuple[str, str]]]:
    """Transaction id -> the (action, by) of each of its op records on the broker."""
    ended: dict[str, list[tuple[str, str]]] = {}
    for rec in await _pull_all(addr, OP_TOPIC):
        p = rec.properties
        ended.setdefault(p[TXN_ID], []).append((p[TXN_ACTION], p[TXN_BY]))
    return ended


async def test_a_standby_never_checks_while_the_leader_lives(txn_mesh: Mesh) -> None:
    checkers, producer = await _two_checkers(txn_mesh, FAST_SCHEDULE | LEADER_TTL)
    broker = txn_mesh.brokers["broker-a"]
    try:
        leader, standby = await _one_leader(*checkers)
        ids = [await producer.begin(unique("tt"), b"undecided-%d" % i) for i in range(6)]
        await until(lambda: leader.stats()["discarded"] == 6, 40,
                    "every transaction discarded by the leader")
        # Exactly the schedule's checks (3), once each: the standby asked nobody.
        assert {i: producer.checks[i] for i in ids} == dict.fromkeys(ids, 3)
        stats = standby.stats()
        assert (stats["role"], stats["checked"], stats["scanning"]) == ("standby", 0, 0)
        ended = await _ops(broker.addr)
        assert {i: ended[i] for i in ids} == dict.fromkeys(ids, [("rollback", "discarded")])
        assert (_role(leader), _role(standby)) == ("leader", "standby")
    finally:
        await producer.stop()
        for c in checkers:
            c.proc.stop()


async def test_a_paused_leader_stops_checking_before_another_leads(txn_mesh: Mesh) -> None:
    """SIGSTOP of the leader for longer than its lease: the standby takes over; the old
    leader, resumed, finds its lease too old and sends nothing more (fencing)."""
    checkers, producer = await _two_checkers(
        txn_mesh, FAST_SCHEDULE | LEADER_TTL | {"FERRY_TXN_CHECKER_MAX_CHECKS": "1000"})
    try:
        leader, standby = await _one_leader(*checkers)
        ids = [await producer.begin(unique("tt"), b"undecided-%d" % i) for i in range(3)]
        await until(lambda: leader.stats()["checked"] >= 3, 20, "checks by the leader")
        os.kill(leader.proc.popen.pid, signal.SIGSTOP)
        try:
            await until(lambda: _role(standby) == "leader", 20, "the standby leading")
        finally:
            os.kill(leader.proc.popen.pid, signal.SIGCONT)
        await until(lambda: _role(leader) == "standby", 10, "the old leader standing by")
        checked = leader.stats()["checked"]
        before = {i: producer.checks[i] for i in ids}
        await asyncio.sleep(3.0)  # three check intervals
        assert leader.stats()["checked"] == checked and _role(leader) == "standby"
        # One leader checks each half once an interval (1 s), not two.
        assert all(1 <= producer.checks[i] - before[i] <= 4 for i in ids), (
            before, dict(producer.checks))
        assert "no longer leader" in leader.proc.log()
    finally:
        await producer.stop()
        for c in checkers:
            c.proc.stop()


@pytest.mark.slow
async def test_1000_open_transactions_survive_the_loss_of_the_leaders_machine(
        txn_mesh: Mesh) -> None:
    """Producers gone; the leader is killed (-9) with its data directory while every
    half is open; a producer of the group started after that answers commit for half
    of them. Each is ended exactly once: the chosen ones committed (one real message
    each), the others rolled back after the check limit; none is left open."""
    env = LEADER_TTL | {"FERRY_TXN_CHECKER_CHECK_IMMUNITY_MS": "1000",
                        "FERRY_TXN_CHECKER_CHECK_INTERVAL_MS": "3000",
                        "FERRY_TXN_CHECKER_MAX_CHECKS": "5"}
    group, topic = unique("tg"), unique("tt")
    broker = txn_mesh.brokers["broker-a"]
    checkers = [start_txn_checker(txn_mesh, f"checker-{i}", env=env) for i in (1, 2)]
    leader, standby = await _one_leader(*checkers)
    gone = await FakeProducer(broker.addr, group, lambda _id, _n: None).start()
    ids = [await gone.begin(topic, b"order-%d" % i) for i in range(1000)]
    await gone.stop()  # the producers are gone: nobody answers a check
    commit = set(ids[::2])
    late: FakeProducer | None = None
    try:
        await until(lambda: (s := leader.stats())["open"] == 1000 and s["checked"] > 0, 30,
                    "every half read and the first checks sent")
        leader.proc.kill9()
        killed = time.monotonic()
        shutil.rmtree(leader.data_dir)
        late = await FakeProducer(broker.addr, group,
                                  lambda i, _n: "commit" if i in commit else None).start()
        await until(lambda: _role(standby) == "leader", 30, "the standby leading")
        took_over_s = time.monotonic() - killed
        await until(lambda: sum(late.checks.values()) > 0, 30, "a check from the new leader")
        first_check_s = time.monotonic() - killed
        await until(lambda: standby.stats()["open"] == 0 and late is not None
                    and len(late.ended) == len(commit), 90, "every transaction resolved")
        print(f"failover: leader after {took_over_s:.2f} s, first check after "
              f"{first_check_s:.2f} s (lease TTL 3 s)")

        ended = await _ops(broker.addr)
        assert set(ended) >= set(ids)
        twice = [i for i in ids if len(ended[i]) != 1]
        assert twice == [], f"{len(twice)} transactions ended more than once"
        for i in ids:
            want = ("commit", "check") if i in commit else ("rollback", "discarded")
            assert ended[i] == [want], i
        delivered = [r.msg_id_hex for r in await _pull_all(broker.addr, topic)]
        assert len(delivered) == len(set(delivered)) == len(commit)  # one real message each
        assert set(delivered) == commit
        # No check beyond the schedule: at most max_checks for those nobody answered,
        # one (answered commit) for the others.
        assert max(late.checks[i] for i in ids if i not in commit) <= 5
        assert {late.checks[i] for i in commit} == {1}
        assert took_over_s < 10
    finally:
        if late is not None:
            await late.stop()
        for c in checkers:
            c.proc.stop()


async def test_a_replaced_half_history_is_read_again_not_skipped(txn_mesh: Mesh) -> None:
    """The checker saved positions past 5 halves; while it is down the broker loses its
    disk and its new %HALF% grows past that offset. Every new half is checked."""
    env = FAST_SCHEDULE | LEADER_TTL
    group, topic = unique("tg"), unique("tt")
    broker = txn_mesh.brokers["broker-a"]
    checker = start_txn_checker(txn_mesh, env=env)
    producer = await FakeProducer(broker.addr, group, lambda _id, _n: None).start()
    try:
        for i in range(5):
            msg_id = await producer.begin(topic, b"before-%d" % i)
            await producer.end(msg_id, "commit")
        await until(lambda: checker.stats()["committed_by_producer"] == 5, 20, "ops read")
        await producer.stop()
        checker.proc.stop()  # saves its positions (offset 5 of the old history)
        broker.proc.kill9()
        shutil.rmtree(broker.data_dir)
        broker = txn_mesh.start_broker("broker-a")
        producer = await FakeProducer(broker.addr, group, lambda _id, _n: "commit").start()
        ids = [await producer.begin(topic, b"after-%d" % i) for i in range(8)]
        checker = start_txn_checker(txn_mesh, http_port=checker.http_port, env=env)
        await until(lambda: len(producer.ended) == 8, 40, "every new half checked")
        ended = await _ops(broker.addr)
        assert {i: ended[i] for i in ids} == dict.fromkeys(ids, [("commit", "check")])
        assert "HISTORY_DIVERGED" in checker.proc.log()
    finally:
        await producer.stop()
        checker.proc.stop()
