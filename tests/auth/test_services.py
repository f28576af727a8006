"""The internal services' own identities with FERRY_AUTH=on at the broker: the delay scheduler
delivers a delayed message and a consumer's retry, the txn-checker resolves a transaction
left open by asking its producer; each identity holds only its rights."""
from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from ferry.client import Consumer, ConsumerRecord, Producer, TransactionProducer, TxnState
from ferry.errors import AccessDeniedError

from tests.broker.auth_support import creds, rules, seed
from tests.client.conftest import Mesh, unique
from tests.client.util import FAST
from tests.delay_scheduler.conftest import SchedulerProc, start_scheduler
from tests.support.procs import Etcd
from tests.txn_checker.conftest import FAST_SCHEDULE, start_txn_checker

pytestmark = pytest.mark.integration

IDENTITIES = {
    # Exactly what the scheduler does on the wire: read %SCHEDULE% as its group, deliver.
    "delay-scheduler": rules(("allow", "topic:%SCHEDULE%", "sub"),
                             ("allow", "group:ferry-delay-scheduler", "consume"),
                             ("allow", "admin", "delay")),
    "app": rules(("allow", "topic:later-*", "pub,sub"), ("allow", "group:app-*", "consume")),
}


@pytest.fixture(scope="module")
def auth_mesh(etcd: Etcd, tmp_path_factory: pytest.TempPathFactory
              ) -> Iterator[tuple[Mesh, SchedulerProc]]:
    mesh = Mesh(etcd, tmp_path_factory.mktemp("auth-services"), broker_env={"FERRY_AUTH": "on"})
    seed(etcd.endpoint, mesh.prefix, IDENTITIES)
    sched_creds = creds("delay-scheduler")
    try:
        mesh.start_namesrv()
        mesh.start_broker("broker-a")
        scheduler = start_scheduler(mesh, "sched-auth", env={
            "FERRY_DELAY_SCHEDULER_ACCESS_KEY": sched_creds.access_key,
            "FERRY_DELAY_SCHEDULER_SECRET_KEY": sched_creds.secret_key})
    except BaseException:
        mesh.stop()
        raise
    yield mesh, scheduler
    scheduler.proc.stop()
    mesh.stop()


async def test_delayed_message_and_retry_are_delivered(
        auth_mesh: tuple[Mesh, SchedulerProc]) -> None:
    mesh, scheduler = auth_mesh
    topic, group = unique("later"), unique("app")
    app = creds("app")
    async with Producer(namesrv=mesh.namesrv, credentials=app) as producer:
        sent = await producer.send_and_wait(topic, b"in a second", delay_ms=1000)
        with pytest.raises(AccessDeniedError):
            await producer.send_and_wait(unique("elsewhere"), b"no")
    seen: list[ConsumerRecord] = []
    done = asyncio.Event()

    async def handler(rec: ConsumerRecord) -> None:
        seen.append(rec)
        if rec.reconsume_times == 0:
            raise RuntimeError("once more, through the retry topic")
        done.set()

    consumer_opts: dict[str, Any] = dict(FAST, auto_offset_reset="earliest",
                                         retry_backoff_ms=[500])
    async with Consumer(topic, group=group, namesrv=mesh.namesrv, credentials=app,
                        **consumer_opts) as consumer:
        task = asyncio.ensure_future(consumer.run(handler))
        await asyncio.wait_for(done.wait(), 30)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert [r.msg_id for r in seen] == [sent.msg_id, sent.msg_id]
    assert [r.reconsume_times for r in seen] == [0, 1]
    # Both went through the scheduler, under its own identity: nothing was refused.
    assert "AccessDeniedError" not in scheduler.proc.log()
    assert "AuthenticationError" not in scheduler.proc.log()


TXN_IDENTITIES = {
    # Exactly what the txn-checker does on the wire: read %HALF% and %OP% as its group,
    # ask producers (CHECK_TRANSACTION) and end what it resolves (END_TRANSACTION).
    "txn-checker": rules(("allow", "topic:%HALF%", "sub"), ("allow", "topic:%OP%", "sub"),
                         ("allow", "group:ferry-txn-checker", "consume"),
                         ("allow", "admin", "txn")),
    "txn-app": rules(("allow", "topic:txn-*", "pub,sub"), ("allow", "group:txg-*", "consume")),
}


@pytest.fixture
def txn_mesh(etcd: Etcd, tmp_path: Path) -> Iterator[Mesh]:
    mesh = Mesh(etcd, tmp_path / "mesh", broker_env={"FERRY_AUTH": "on"})
    seed(etcd.endpoint, mesh.prefix, TXN_IDENTITIES)
    checker_creds = creds("txn-checker")
    try:
        mesh.start_namesrv()
        mesh.start_broker("broker-a")
        checker = start_txn_checker(mesh, env=FAST_SCHEDULE | {
            "FERRY_TXN_CHECKER_ACCESS_KEY": checker_creds.access_key,
            "FERRY_TXN_CHECKER_SECRET_KEY": checker_creds.secret_key})
    except BaseException:
        mesh.stop()
        raise
    yield mesh
    checker.proc.stop()
    assert "AccessDeniedError" not in checker.proc.log()
    mesh.stop()


async def test_the_txn_checker_resolves_a_transaction_with_auth_on(txn_mesh: Mesh) -> None:
    checked: list[str] = []
    topic, group = unique("txn"), unique("txg")
    app = creds("txn-app")

    def local_state(record: ConsumerRecord) -> TxnState:
        checked.append(record.msg_id)
        return TxnState.COMMIT

    async with TransactionProducer(group=group, namesrv=txn_mesh.namesrv, checker=local_state,
                                   credentials=app) as producer:
        left_open = await producer.begin(topic, b"decided by the check")
        got: list[ConsumerRecord] = []
        async with Consumer(topic, group=unique("txg"), namesrv=txn_mesh.namesrv,
                            credentials=app, auto_offset_reset="earliest", **FAST) as consumer:
            for _ in range(100):
                for records in (await consumer.getmany(timeout_ms=300)).values():
                    got.extend(records)
                if got:
                    break
    assert [r.msg_id for r in got] == [left_open.msg_id]
    assert checked == [left_open.msg_id]
