"""Transactional messages against a real mesh (namesrv + two brokers).

The check-back is driven here the way the txn-checker drives it: a
CHECK_TRANSACTION (group, msg_id) request to the broker holding the half,
which forwards it to a live producer of the group. Skipped while the brokers
do not handle END_TRANSACTION yet.
"""
from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from ferry import Consumer, Producer, TransactionProducer, TxnState
from ferry.client.core.connection import ConnectionPool
from ferry.errors import MessageNotFoundError, TransactionStateError, UnknownCodeError
from ferry.wire import RequestCode

from tests.client.conftest import Mesh, unique
from tests.client.util import FAST, collect
from tests.support.procs import spawn

pytestmark = pytest.mark.integration

CHILD = str(Path(__file__).with_name("txn_child.py"))
#: How long a consumer keeps pulling to show that a message does NOT arrive.
ABSENT_S = 2.0


@pytest.fixture(scope="module")
def txn_ready(mesh: Mesh) -> Mesh:
    """The mesh, once its brokers know END_TRANSACTION (else the module is skipped)."""
    asyncio.run(_probe(mesh))
    return mesh


async def _probe(mesh: Mesh) -> None:
    pool = ConnectionPool()
    try:
        for b in mesh.brokers.values():
            try:
                await pool.request(b.addr, RequestCode.END_TRANSACTION,
                                   {"group": "probe", "msg_id": b"\0" * 16, "action": "commit",
                                    "from_check": False, "by": "producer"})
            except UnknownCodeError:
                pytest.skip("the broker does not handle END_TRANSACTION yet")
            except MessageNotFoundError:
                pass
    finally:
        await pool.close()


def consumer(mesh: Mesh, topic: str, group: str | None = None, **kw: Any) -> Consumer:
    return Consumer(topic, group=group or unique("g"), namesrv=mesh.namesrv,
                    auto_offset_reset="earliest", **{**FAST, **kw})


async def bodies(c: Consumer, n: int, settle_s: float = ABSENT_S,
                 timeout_s: float = 20.0) -> list[bytes]:
    """The bodies of `n` records (or fewer by `timeout_s`) and any arriving `settle_s` later."""
    got = await collect([c], n, timeout_s=timeout_s, settle_s=settle_s)
    return [r.body for r in got[0]]


@pytest.fixture
async def tp(txn_ready: Mesh) -> AsyncIterator[TransactionProducer]:
    async with TransactionProducer(group=unique("tx"), namesrv=txn_ready.namesrv,
                                   heartbeat_interval_ms=300,
                                   checker=lambda rec: TxnState.UNKNOWN) as producer:
        yield producer


async def check(mesh: Mesh, addr: str, group: str, msg_id: str) -> bool:
    """What the txn-checker does: ask the broker to forward a check; True if forwarded."""
    pool = ConnectionPool()
    try:
        resp = await pool.request(addr, RequestCode.CHECK_TRANSACTION,
                                  {"group": group, "msg_id": bytes.fromhex(msg_id)})
        return bool(resp.fields.get("forwarded"))
    finally:
        await pool.close()


async def test_commit_once_rollback_never(txn_ready: Mesh, tp: TransactionProducer) -> None:
    topic = unique("txn")
    committed = await tp.begin(topic, b"commit-me", key="order-1")
    rolled = await tp.begin(topic, b"roll-me-back", key="order-2")
    assert len(committed.msg_id) == 32 and committed.topic == topic
    await committed.commit()
    await committed.commit()              # the same way again: harmless
    await rolled.rollback()
    with pytest.raises(TransactionStateError):
        await rolled.commit()
    async with consumer(txn_ready, topic) as c:
        got = await collect([c], 1, timeout_s=20, settle_s=ABSENT_S)
    records = got[0]
    assert [r.body for r in records] == [b"commit-me"]
    assert records[0].msg_id == committed.msg_id and records[0].key == "order-1"


async def test_context_manager_and_send_in_transaction(txn_ready: Mesh,
                                                       tp: TransactionProducer) -> None:
    topic = unique("txn")
    async with tp.transaction(topic, b"block-ok") as txn:
        pass
    assert txn.state is TxnState.COMMIT
    with pytest.raises(RuntimeError):
        async with tp.transaction(topic, b"block-failed") as failed:
            raise RuntimeError("local transaction failed")
    assert failed.state is TxnState.ROLLBACK

    async def ok(txn: Any) -> TxnState:
        return TxnState.COMMIT

    def boom(txn: Any) -> TxnState:
        raise RuntimeError("crashed after its own commit?")

    assert await tp.send_in_transaction(topic, b"exec-commit", execute=ok) is TxnState.COMMIT
    assert await tp.send_in_transaction(topic, b"exec-rollback",
                                        execute=lambda t: TxnState.ROLLBACK) is TxnState.ROLLBACK
    assert await tp.send_in_transaction(topic, b"exec-unknown",
                                        execute=lambda t: TxnState.UNKNOWN) is TxnState.UNKNOWN
    assert await tp.send_in_transaction(topic, b"exec-raised", execute=boom) is TxnState.UNKNOWN
    async with consumer(txn_ready, topic) as c:
        assert sorted(await bodies(c, 2)) == [b"block-ok", b"exec-commit"]


async def test_half_never_visible_even_to_broadcasting(txn_ready: Mesh,
                                                       tp: TransactionProducer) -> None:
    topic = unique("txn")
    txn = await tp.begin(topic, b"half")
    async with Producer(namesrv=txn_ready.namesrv) as p:
        await p.send_and_wait(topic, b"plain-after")
    async with consumer(txn_ready, topic) as cl, \
            consumer(txn_ready, topic, mode="broadcasting") as bc:
        assert await bodies(cl, 1) == [b"plain-after"]
        assert await bodies(bc, 1) == [b"plain-after"]
        await txn.commit()
        assert await bodies(cl, 1, settle_s=0.5) == [b"half"]
        assert await bodies(bc, 1, settle_s=0.5) == [b"half"]


async def test_killed_producer_is_answered_for_by_another(txn_ready: Mesh,
                                                          tmp_path: Path) -> None:
    topic, group = unique("txn"), unique("tx")
    out = tmp_path / "child.out"
    child = spawn("txn-child", [sys.executable, CHILD, txn_ready.namesrv, topic, group,
                                str(out)], tmp_path)
    try:
        for _ in range(300):
            if out.exists() and out.read_text().endswith("\n"):
                break
            await asyncio.sleep(0.1)
        msg_id, addr = out.read_text().split()
    finally:
        child.kill9()
    asked: list[Any] = []

    def checker(rec: Any) -> TxnState:
        asked.append(rec)
        return TxnState.COMMIT

    async with TransactionProducer(group=group, namesrv=txn_ready.namesrv,
                                   heartbeat_interval_ms=300, checker=checker):
        async with consumer(txn_ready, topic) as c:
            for _ in range(100):      # until the broker forwards to the live instance
                await check(txn_ready, addr, group, msg_id)
                got = await collect([c], 1, timeout_s=0.5)
                if got[0]:
                    break
            got[0] += (await collect([c], 1, timeout_s=ABSENT_S))[0]
    assert [r.body for r in got[0]] == [b"from-child"]
    assert asked[0].topic == topic and asked[0].msg_id == msg_id and asked[0].key == "child"


async def test_unknown_three_times_then_commit(txn_ready: Mesh) -> None:
    topic, group = unique("txn"), unique("tx")
    answers = [TxnState.UNKNOWN] * 3 + [TxnState.COMMIT]
    asked = asyncio.Queue[str]()

    def checker(rec: Any) -> TxnState:
        asked.put_nowait(rec.msg_id)
        return answers.pop(0)

    async with TransactionProducer(group=group, namesrv=txn_ready.namesrv,
                                   heartbeat_interval_ms=300, checker=checker) as tp:
        txn = await tp.begin(topic, b"decided-late")
        async with consumer(txn_ready, topic) as c:
            for n in range(4):
                assert await check(txn_ready, txn.addr, group, txn.msg_id)
                assert await asyncio.wait_for(asked.get(), 10) == txn.msg_id
                if n < 3:
                    assert await bodies(c, 1, settle_s=0, timeout_s=0.5) == []
            assert await bodies(c, 1) == [b"decided-late"]
        with pytest.raises(TransactionStateError):
            await txn.rollback()
