"""Topic `type` and group `broadcast_allowed`, enforced by the broker (topic_types.py).

On a real mesh (namesrv + one broker over etcd), through the client library
as a user sends: a typed topic refuses the messages it does not take with
MessageTypeMismatchError (not retriable) and takes the ones it does; a group
with broadcast disallowed refuses a broadcasting member at its first heartbeat.
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator

import pytest
from ferry import (
    Admin,
    BroadcastNotAllowedError,
    Consumer,
    MessageTypeMismatchError,
    Producer,
    TransactionProducer,
    TxnState,
)

from tests.client.conftest import Mesh, start_mesh, unique
from tests.client.util import FAST, collect
from tests.support.procs import Etcd

pytestmark = pytest.mark.integration

#: How long a broker may take to see a config that namesrv just wrote to etcd.
CONFIG_SEEN_S = 10.0


@pytest.fixture(scope="module")
def mesh(etcd: Etcd, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mesh]:
    m = start_mesh(etcd, tmp_path_factory.mktemp("types-mesh"), ("broker-a",))
    yield m
    m.stop()


async def refused(send: Callable[[], Awaitable[object]],
                  taken: list[int] | None = None) -> MessageTypeMismatchError:
    """The refusal of `send`, once the broker has seen the topic's config (a send before
    that is stored as on a normal topic, as it was before the type was written; `taken`
    gets one entry per such send)."""
    deadline = time.monotonic() + CONFIG_SEEN_S
    while True:
        try:
            await send()
        except MessageTypeMismatchError as exc:
            return exc
        if taken is not None:
            taken.append(1)
        if time.monotonic() > deadline:
            raise AssertionError("the typed topic kept taking a message it must refuse")
        await asyncio.sleep(0.1)


async def test_a_fifo_topic_takes_keyed_messages_only(mesh: Mesh) -> None:
    topic = unique("fifo")
    async with Admin(namesrv=mesh.namesrv) as admin:
        await admin.create_topic(topic, queues=4, type="fifo")
    async with Producer(namesrv=mesh.namesrv) as producer:
        exc = await refused(lambda: producer.send_and_wait(topic, b"no group"))
        assert not exc.retriable and exc.code == 28
        assert f"topic {topic} is of type fifo" in str(exc) and "without a key" in str(exc)
        delayed = await refused(lambda: producer.send_and_wait(topic, b"later", key="k",
                                                               delay_ms=60_000))
        assert "a delayed message" in str(delayed)
        first = await producer.send_and_wait(topic, b"one", key="order-1", ordered=True)
        second = await producer.send_and_wait(topic, b"two", key="order-1", ordered=True)
    assert (second.queue_id, second.queue_offset) == (first.queue_id, first.queue_offset + 1)


async def test_a_delay_topic_takes_delayed_messages_only(mesh: Mesh) -> None:
    topic = unique("delay")
    async with Admin(namesrv=mesh.namesrv) as admin:
        await admin.create_topic(topic, type="delay")
    async with Producer(namesrv=mesh.namesrv) as producer:
        exc = await refused(lambda: producer.send_and_wait(topic, b"now"))
        assert "takes only delayed messages" in str(exc) and not exc.retriable
        later = await producer.send_and_wait(topic, b"later", delay_ms=60_000)
    assert later.queue_offset == -1   # held in %SCHEDULE% for the delay scheduler


async def test_a_transaction_topic_takes_transactional_messages_only(mesh: Mesh) -> None:
    topic = unique("txn")
    async with Admin(namesrv=mesh.namesrv) as admin:
        await admin.create_topic(topic, type="transaction")
    async with Producer(namesrv=mesh.namesrv) as producer:
        early: list[int] = []   # plain sends stored before the brokers saw the type
        exc = await refused(lambda: producer.send_and_wait(topic, b"plain", key="k"), early)
        assert "takes only transactional messages" in str(exc)
    async with TransactionProducer(group=unique("tx"), namesrv=mesh.namesrv,
                                   checker=lambda rec: TxnState.UNKNOWN) as tp:
        txn = await tp.begin(topic, b"committed", key="order-1")
        await txn.commit()   # the broker's own write into the topic: not a SEND, taken
    async with Consumer(topic, group=unique("g"), namesrv=mesh.namesrv,
                        auto_offset_reset="earliest", **FAST) as consumer:
        got = await collect([consumer], 1 + len(early), timeout_s=20, settle_s=1.0)
    # after the refusal nothing plain is taken: only the transaction's committed message
    assert sorted(r.body for r in got[0]) == sorted([b"committed"] + [b"plain"] * len(early))


async def test_a_normal_topic_takes_every_kind(mesh: Mesh) -> None:
    topic = unique("normal")
    async with Admin(namesrv=mesh.namesrv) as admin:
        await admin.create_topic(topic)   # type "normal", the default
    async with Producer(namesrv=mesh.namesrv) as producer:
        await producer.send_and_wait(topic, b"plain")
        await producer.send_and_wait(topic, b"keyed", key="k", ordered=True)
        assert (await producer.send_and_wait(topic, b"later", delay_ms=60_000)).queue_offset == -1


async def test_a_group_without_broadcast_refuses_a_broadcasting_member(mesh: Mesh) -> None:
    topic, closed, open_ = unique("bc"), unique("no-bc"), unique("bc-ok")
    async with Admin(namesrv=mesh.namesrv) as admin:
        await admin.create_topic(topic)
        await admin.create_group(closed, broadcast_allowed=False)
        await admin.create_group(open_)
    deadline = time.monotonic() + CONFIG_SEEN_S
    while True:   # until the broker has seen the group's config
        member = Consumer(topic, group=closed, namesrv=mesh.namesrv, mode="broadcasting", **FAST)
        try:
            await member.start()
        except BroadcastNotAllowedError as exc:
            assert not exc.retriable and exc.code == 29
            assert f"group {closed} does not allow broadcasting" in str(exc)
            break
        finally:
            await member.stop()
        assert time.monotonic() < deadline, "the broker kept taking the broadcasting member"
        await asyncio.sleep(0.1)
    async with Consumer(topic, group=closed, namesrv=mesh.namesrv, **FAST):
        pass   # a clustering member of the same group is taken
    async with Consumer(topic, group=open_, namesrv=mesh.namesrv, mode="broadcasting", **FAST):
        pass   # broadcast_allowed defaults to true
