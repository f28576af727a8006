"""TransactionProducer with the real txn-checker service doing the check-back.

One mesh (namesrv + one broker) and one txn-checker with a short schedule
(first check 1 s after the half, then every second) for the module; each test
uses its own producer group and topic.
"""
from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from ferry import TransactionProducer, TxnState
from ferry.errors import TransactionStateError

from tests.client.conftest import Mesh, start_mesh, unique
from tests.client.test_transactions import ABSENT_S, CHILD, bodies, consumer
from tests.support.procs import Etcd, spawn

checker_conftest = pytest.importorskip("tests.txn_checker.conftest",
                                       reason="the txn-checker's test starter has not landed")

pytestmark = pytest.mark.integration

SCHEDULE = {**checker_conftest.FAST_SCHEDULE, "FERRY_TXN_CHECKER_MAX_CHECKS": "5"}


@pytest.fixture(scope="module")
def checked(etcd: Etcd, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Mesh, Any]]:
    mesh = start_mesh(etcd, tmp_path_factory.mktemp("txn-checked"), ("broker-a",))
    try:
        service = checker_conftest.start_txn_checker(mesh, env=SCHEDULE)
    except BaseException:
        mesh.stop()
        raise
    yield mesh, service
    service.proc.stop()
    mesh.stop()


async def wait_state(service: Any, msg_id: str, want: str, timeout_s: float = 40.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        status, body = await asyncio.to_thread(service.get, f"/v1/transactions/{msg_id}")
        if status == 200 and body.get("state") == want:
            return
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"{msg_id} never reached {want}: {status} {body}")
        await asyncio.sleep(0.1)


async def ferry_txn(service: Any, *args: str) -> tuple[int, str, str]:
    ferry = str(Path(sys.executable).with_name("ferry"))
    proc = await asyncio.create_subprocess_exec(
        ferry, "txn", *args, "--txn-checker", service.addr,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_unknown_three_times_then_commit(checked: tuple[Mesh, Any]) -> None:
    mesh, service = checked
    topic, group = unique("txn"), unique("tx")
    answers = [TxnState.UNKNOWN, "unknown", TxnState.UNKNOWN, TxnState.COMMIT]
    asked: list[str] = []

    async def checker(rec: Any) -> Any:
        asked.append(rec.msg_id)
        return answers[len(asked) - 1] if len(asked) <= len(answers) else TxnState.COMMIT

    async with TransactionProducer(group=group, namesrv=mesh.namesrv, heartbeat_interval_ms=300,
                                   checker=checker) as tp:
        txn = await tp.begin(topic, b"decided-late", key="order-42")
        async with consumer(mesh, topic) as c:
            assert await bodies(c, 1, settle_s=ABSENT_S) == [b"decided-late"]
        await wait_state(service, txn.msg_id, "committed")
        assert asked == [txn.msg_id] * 4
        with pytest.raises(TransactionStateError):
            await txn.rollback()


async def test_killed_producer_rolled_back_by_another(checked: tuple[Mesh, Any],
                                                      tmp_path: Path) -> None:
    mesh, service = checked
    topic, group = unique("txn"), unique("tx")
    out = tmp_path / "child.out"
    child = spawn("txn-child", [sys.executable, CHILD, mesh.namesrv, topic, group, str(out)],
                  tmp_path)
    try:
        for _ in range(300):
            if out.exists() and out.read_text().endswith("\n"):
                break
            await asyncio.sleep(0.1)
        msg_id, _addr = out.read_text().split()
    finally:
        child.kill9()
    asked: list[str] = []

    def checker(rec: Any) -> TxnState:
        asked.append(rec.msg_id)
        return TxnState.ROLLBACK

    async with TransactionProducer(group=group, namesrv=mesh.namesrv, heartbeat_interval_ms=300,
                                   checker=checker):
        await wait_state(service, msg_id, "rolled_back")
    assert asked == [msg_id]
    async with consumer(mesh, topic) as c:
        assert await bodies(c, 1, settle_s=0, timeout_s=ABSENT_S) == []


async def test_always_unknown_is_discarded_and_listed(checked: tuple[Mesh, Any]) -> None:
    mesh, service = checked
    topic, group = unique("txn"), unique("tx")
    async with TransactionProducer(group=group, namesrv=mesh.namesrv, heartbeat_interval_ms=300,
                                   checker=lambda rec: TxnState.UNKNOWN) as tp:
        txn = await tp.begin(topic, b"never-decided")
        await wait_state(service, txn.msg_id, "open")   # once the checker's scan saw it
        code, out, err = await ferry_txn(service, "list")
        assert code == 0, err
        assert txn.msg_id in out and f"group={group}" in out
        await wait_state(service, txn.msg_id, "discarded")
        with pytest.raises(TransactionStateError):
            await txn.commit()
    code, out, err = await ferry_txn(service, "list", "--discarded")
    assert code == 0, err
    assert txn.msg_id in out and "discarded" in out
    code, out, err = await ferry_txn(service, "describe", txn.msg_id)
    assert code == 0 and '"discarded"' in out and txn.msg_id in out
    code, out, err = await ferry_txn(service, "describe", "0F" * 16)
    assert code == 1 and "MessageNotFoundError" in err
    async with consumer(mesh, topic) as c:
        assert await bodies(c, 1, settle_s=0, timeout_s=ABSENT_S) == []


async def test_commit_before_its_own_immunity_is_never_checked(
        checked: tuple[Mesh, Any]) -> None:
    mesh, service = checked
    topic, group = unique("txn"), unique("tx")
    asked: list[str] = []

    def checker(rec: Any) -> TxnState:
        asked.append(rec.msg_id)
        return TxnState.ROLLBACK

    async with TransactionProducer(group=group, namesrv=mesh.namesrv, heartbeat_interval_ms=300,
                                   checker=checker) as tp:
        # The service would check after 1 s; this half's own immunity says 4 s.
        txn = await tp.begin(topic, b"slow-local-txn", check_immunity_ms=4_000)
        await wait_state(service, txn.msg_id, "open")
        await asyncio.sleep(3.0)          # the local transaction takes 3 s, inside immunity
        await txn.commit()
        await wait_state(service, txn.msg_id, "committed")
        await asyncio.sleep(2.0)          # past the immunity: still no check
    assert asked == []
    async with consumer(mesh, topic) as c:
        assert await bodies(c, 1) == [b"slow-local-txn"]
