"""Reset commits (COMMIT_OFFSET with `reset`, issue 25) on a real broker with auth on:
the right they need, the refusal while the group has live members, and the PULL answer
that moves a live member (OFFSET_RESET) while its stale commits are ignored."""
from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
from ferry.client.core.connection import BrokerConnection
from ferry.errors import AccessDeniedError, BusyError, MalformedRequestError
from ferry.wire import RequestCode

from tests.broker.auth_support import creds, rules, seed
from tests.broker.conftest import Broker, start_broker, unique_prefix
from tests.broker.test_offsets_auth import commit, committed, put
from tests.support.procs import Etcd

pytestmark = pytest.mark.integration

IDENTITIES = {
    "producer": rules(("allow", "topic:*", "pub")),
    "member": rules(("allow", "group:g", "consume"), ("allow", "topic:t", "sub")),
    "operator": rules(("allow", "group:g", "reset")),
}


@pytest.fixture
def broker(tmp_path_factory: pytest.TempPathFactory, etcd: Etcd) -> Iterator[Broker]:
    prefix = unique_prefix()
    seed(etcd.endpoint, prefix, IDENTITIES)
    b = start_broker(tmp_path_factory.mktemp("offset-resets"), etcd, prefix=prefix,
                     FERRY_AUTH="on", FERRY_BROKER_DEFAULT_QUEUES="1")
    yield b
    b.proc.stop()


@pytest.fixture
async def conns(broker: Broker) -> AsyncIterator[dict[str, BrokerConnection]]:
    opened = {key: await BrokerConnection.open(f"127.0.0.1:{broker.port}",
                                               credentials=creds(key)) for key in IDENTITIES}
    yield opened
    for conn in opened.values():
        await conn.close()


async def reset(conn: BrokerConnection, offset: int, **flags: object) -> dict[str, object]:
    resp = await conn.request(RequestCode.COMMIT_OFFSET,
                              {"group": "g", "topic": "t", "queue_id": 0, "offset": offset,
                               "reset": True, **flags})
    return dict(resp.fields)


async def pull(conn: BrokerConnection, offset: int) -> dict[str, object]:
    resp = await conn.request(RequestCode.PULL, {"group": "g", "topic": "t", "queue_id": 0,
                                                 "offset": offset, "max_count": 32})
    return dict(resp.fields)


async def test_a_reset_needs_the_reset_right_and_answers_from_and_to(
        conns: dict[str, BrokerConnection]) -> None:
    await put(conns, "t", 0, 5)
    await commit(conns["member"], "g", "t", 0, 5)
    with pytest.raises(AccessDeniedError, match="'reset'"):   # consume is not enough
        await reset(conns["member"], 0)
    with pytest.raises(MalformedRequestError):
        await reset(conns["operator"], 0, force="yes")
    assert await committed(conns["member"], "g", "t", 0) == 5
    assert await reset(conns["operator"], 2) == {"from": 5, "to": 2}
    assert await committed(conns["member"], "g", "t", 0) == 2
    assert (await reset(conns["operator"], 99))["to"] == 5   # held to the queue's end


async def test_live_members_refuse_a_reset_unless_forced_then_follow_it(
        conns: dict[str, BrokerConnection]) -> None:
    member, operator = conns["member"], conns["operator"]
    await put(conns, "t", 0, 6)
    await member.request(RequestCode.HEARTBEAT, {"client_id": "m1", "group": "g",
                                                 "topics": ["t"], "mode": "clustering"})
    await commit(member, "g", "t", 0, 6)
    with pytest.raises(BusyError, match="live member"):
        await reset(operator, 1)
    assert await committed(member, "g", "t", 0) == 6
    assert await reset(operator, 1, force=True) == {"from": 6, "to": 1}
    # The member's stale commit is ignored; its PULL elsewhere is sent to the reset offset.
    resp = await member.request(RequestCode.COMMIT_OFFSET, {"group": "g", "topic": "t",
                                                            "queue_id": 0, "offset": 6})
    assert resp.fields == {"reset_pending": 1}
    assert await committed(member, "g", "t", 0) == 1
    answer = await pull(member, 6)
    assert answer["status"] == "OFFSET_RESET" and answer["next_offset"] == 1
    # Once it pulls from there, it reads and its commits count again.
    answer = await pull(member, 1)
    assert answer["status"] == "FOUND" and answer["next_offset"] == 6
    await commit(member, "g", "t", 0, 6)
    assert await committed(member, "g", "t", 0) == 6
