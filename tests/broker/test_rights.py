"""Rights that hold with FERRY_AUTH=on (issue 24), on a real namesrv and broker over etcd:
`consume` on a group sends back only stored messages of topics the identity reads, a
transaction's check-backs and END belong to those who may publish to its topic, and topic
creation is bounded per broker and per identity."""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from ferry.client import Consumer, ConsumerRecord
from ferry.client.core.connection import BrokerConnection
from ferry.codec import ORIGIN_TOPIC, iter_records
from ferry.errors import AccessDeniedError, BusyError, FerryError, MessageNotFoundError
from ferry.names import retry_topic
from ferry.wire import Frame, RequestCode, encode_messages

from tests.broker.auth_support import ADMIN_RULES, creds, rules, seed, seeded_mesh
from tests.broker.conftest import Broker, start_broker, unique_prefix
from tests.broker.txn_client import TXN_HALF, half_message
from tests.broker.wire_client import message
from tests.client.conftest import Mesh, unique
from tests.client.util import FAST
from tests.support.procs import Etcd

pytestmark = pytest.mark.integration

IDENTITIES = {
    "root": ADMIN_RULES,
    "publisher": rules(("allow", "topic:tasks-*", "pub"), ("allow", "topic:secret-*", "pub")),
    # A Celery-style worker: reads its task topics as its group, nothing else.
    "worker": rules(("allow", "topic:tasks-*", "sub"), ("allow", "group:workers-*", "consume")),
    "txn-producer": rules(("allow", "topic:orders-*", "pub"), ("allow", "group:txg-*", "consume")),
    # A member of the producer group that may not publish to the transaction's topic.
    "txn-spy": rules(("allow", "group:txg-*", "consume")),
    "checker": rules(("allow", "admin", "txn")),
}


@pytest.fixture(scope="module")
def mesh(etcd: Etcd, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mesh]:
    with seeded_mesh(Mesh(etcd, tmp_path_factory.mktemp("rights"),
                          broker_env={"FERRY_AUTH": "on"}), IDENTITIES) as mesh:
        yield mesh


async def connect(mesh: Mesh, access_key: str,
                  pushed: list[Frame] | None = None) -> BrokerConnection:
    """A signed connection to broker-a; CHECK_TRANSACTION pushes land in `pushed`."""
    handlers = {} if pushed is None else {
        RequestCode.CHECK_TRANSACTION: lambda conn, frame: pushed.append(frame)}
    return await BrokerConnection.open(mesh.brokers["broker-a"].addr, credentials=creds(access_key),
                                       request_handlers=handlers)


@pytest.fixture
async def conns(mesh: Mesh) -> AsyncIterator[dict[str, BrokerConnection]]:
    out = {key: await connect(mesh, key) for key in ("root", "publisher", "worker")}
    yield out
    for conn in out.values():
        await conn.close()


async def retry_copies(root: BrokerConnection, group: str) -> list[Any]:
    """Every record in the group's retry topic (none when it was never created)."""
    resp = await root.request(RequestCode.PULL, {
        "group": group, "topic": retry_topic(group), "queue_id": 0, "offset": 0,
        "max_count": 64, "max_wait_ms": 0})
    return list(iter_records(resp.body)) if resp.body else []


async def test_send_back_is_for_stored_messages_of_topics_the_group_reads(
        mesh: Mesh, conns: dict[str, BrokerConnection]) -> None:
    topic, secret, group = unique("tasks"), unique("secret"), unique("workers")
    task = message(b"add(2, 2)")
    sent = await conns["publisher"].request(RequestCode.SEND, {"topic": topic, "queue_id": 0},
                                            encode_messages([task]))
    hidden = message(b"the payroll")
    await conns["publisher"].request(RequestCode.SEND, {"topic": secret, "queue_id": 0},
                                     encode_messages([hidden]))
    worker = conns["worker"]
    nack = {"group": group, "reconsume_times": 1, "delay_ms": 0, "max_reconsume_times": 3}
    # A task of the worker's making, passed off as a message of the group's topic.
    forged = message(b"os.system('rm -rf /')", properties={ORIGIN_TOPIC: topic})
    with pytest.raises(FerryError):
        await worker.request(RequestCode.SEND_BACK, {**nack, "topic": topic},
                             encode_messages([forged]))
    ref = {"topic": topic, "queue_id": 0, "queue_offset": sent.fields["queue_offset"],
           "msg_id": task.msg_id}
    with pytest.raises(MessageNotFoundError):   # no message at that offset
        await worker.request(RequestCode.SEND_BACK, {**nack, **ref, "queue_offset": 99})
    with pytest.raises(MessageNotFoundError):   # another id than the one stored there
        await worker.request(RequestCode.SEND_BACK, {**nack, **ref, "msg_id": forged.msg_id})
    with pytest.raises(AccessDeniedError, match=f"'sub' on 'topic:{secret}'"):
        await worker.request(RequestCode.SEND_BACK, {**nack, "topic": secret, "queue_id": 0,
                                                     "queue_offset": 0,
                                                     "msg_id": hidden.msg_id})
    assert await retry_copies(conns["root"], group) == []   # the group receives nothing

    # The genuine nack of a real consumer with these rights still brings the task back.
    deliveries: asyncio.Queue[ConsumerRecord] = asyncio.Queue()

    async def fail_first(record: ConsumerRecord) -> None:
        deliveries.put_nowait(record)
        if not record.reconsume_times:
            raise RuntimeError("try once more")

    async with Consumer(topic, group=group, namesrv=mesh.namesrv, credentials=creds("worker"),
                        retry_backoff_ms=[0], auto_offset_reset="earliest", **FAST) as consumer:
        task_run = asyncio.ensure_future(consumer.run(fail_first))
        seen = [await asyncio.wait_for(deliveries.get(), 30) for _ in range(2)]
        task_run.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task_run
    assert [(r.body, r.topic, r.reconsume_times) for r in seen] == [
        (b"add(2, 2)", topic, 0), (b"add(2, 2)", topic, 1)]
    (copy,) = await retry_copies(conns["root"], group)
    assert bytes(copy.body) == b"add(2, 2)" and copy.properties[ORIGIN_TOPIC] == topic


async def test_check_backs_and_ends_only_for_producers_of_the_topic(mesh: Mesh) -> None:
    topic, group = unique("orders"), unique("txg")
    spy_pushes: list[Frame] = []
    producer_pushes: list[Frame] = []
    producer = await connect(mesh, "txn-producer", producer_pushes)
    spy = await connect(mesh, "txn-spy", spy_pushes)
    checker = await connect(mesh, "checker")
    try:
        half = half_message(b"pay 10", group)
        await producer.request(RequestCode.SEND, {"topic": topic, "queue_id": 0,
                                                  "flags": TXN_HALF}, encode_messages([half]))
        beat = {"group": group, "role": "producer"}
        await spy.request(RequestCode.HEARTBEAT, {**beat, "client_id": "spy"})
        check = {"group": group, "msg_id": half.msg_id}
        answer = await checker.request(RequestCode.CHECK_TRANSACTION, check)
        assert answer.fields["forwarded"] is False   # its only producer may not publish there
        with pytest.raises(AccessDeniedError, match=f"'pub' on 'topic:{topic}'"):
            await spy.request(RequestCode.END_TRANSACTION, {**check, "action": "commit"})

        await producer.request(RequestCode.HEARTBEAT, {**beat, "client_id": "real"})
        for _ in range(3):   # round robin over both members: never the spy
            answer = await checker.request(RequestCode.CHECK_TRANSACTION, check)
            assert answer.fields["forwarded"] is True and answer.fields["client_id"] == "real"
        await spy.request(RequestCode.HEARTBEAT, {**beat, "client_id": "spy"})  # after pushes
        assert spy_pushes == [] and len(producer_pushes) == 3
        assert producer_pushes[0].fields["topic"] == topic
        ended = await producer.request(RequestCode.END_TRANSACTION, {**check, "action": "commit"})
        assert ended.fields["state"] == "committed"
        with pytest.raises(AccessDeniedError):   # ended already: still not the spy's to see
            await spy.request(RequestCode.END_TRANSACTION, {**check, "action": "commit"})
    finally:
        for conn in (producer, spy, checker):
            await conn.close()


LIMIT_IDENTITIES = {
    "spammer": rules(("allow", "topic:*", "pub")),
    "other": rules(("allow", "topic:*", "pub")),
    "late": rules(("allow", "topic:*", "pub")),
}


@pytest.fixture(scope="module")
def limited_broker(tmp_path_factory: pytest.TempPathFactory, etcd: Etcd) -> Iterator[Broker]:
    prefix = unique_prefix()
    seed(etcd.endpoint, prefix, LIMIT_IDENTITIES)
    b = start_broker(Path(tmp_path_factory.mktemp("limited")), etcd, prefix=prefix,
                     FERRY_AUTH="on", FERRY_BROKER_MAX_TOPICS="5",
                     FERRY_BROKER_MAX_TOPICS_PER_IDENTITY="3")
    yield b
    b.proc.stop()
    print(b.proc.log()[-5000:])


async def test_topic_creation_is_bounded_per_identity_and_per_broker(
        limited_broker: Broker) -> None:
    addr = f"127.0.0.1:{limited_broker.port}"
    conns = {key: await BrokerConnection.open(addr, credentials=creds(key))
             for key in LIMIT_IDENTITIES}

    async def send(who: str, topic: str) -> None:
        await conns[who].request(RequestCode.SEND, {"topic": topic, "queue_id": 0},
                                 encode_messages([message(b"x")]))

    try:
        for i in range(3):
            await send("spammer", f"spam-{i}")
        with pytest.raises(BusyError, match="MAX_TOPICS_PER_IDENTITY"):
            await send("spammer", "spam-3")
        await send("spammer", "spam-0")   # its existing topics still take messages
        await send("other", "other-0")    # other identities keep creating
        await send("other", "other-1")
        with pytest.raises(BusyError, match="serves 5 topics"):
            await send("late", "late-0")  # the broker is full
        await send("late", "other-1")     # served topics take messages from anyone allowed
    finally:
        for conn in conns.values():
            await conn.close()
