"""Consumer-offset commits with FERRY_AUTH=on on a real broker process (issue 24), and
reset commits (COMMIT_OFFSET with `reset`, issue 25).

`consume` on one group must not let an identity fill the broker's shared offset
table: commits name only queues that exist here, never past their end, and the
entries one identity's commits create are capped (OFFSETS_MAX_PER_IDENTITY);
past the cap that identity alone is refused, and other groups commit on.
"""
from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
from ferry.client.core.connection import BrokerConnection
from ferry.errors import AccessDeniedError, BusyError, MalformedRequestError, TopicNotFoundError
from ferry.wire import RequestCode

from tests.broker.auth_support import creds, rules, seed
from tests.broker.conftest import Broker, start_broker, unique_prefix
from tests.broker.wire_client import encode_messages, message
from tests.support.procs import Etcd

pytestmark = pytest.mark.integration

PER_IDENTITY = 6
IDENTITIES = {
    "producer": rules(("allow", "topic:*", "pub")),
    "flooder": rules(("allow", "group:gf", "consume")),
    "other": rules(("allow", "group:go", "consume")),
    # Offset resets (issue 25): a member of group g, and an operator who may reset it.
    "member": rules(("allow", "group:g", "consume"), ("allow", "topic:t", "sub")),
    "operator": rules(("allow", "group:g", "reset")),
}


@pytest.fixture
def broker(tmp_path_factory: pytest.TempPathFactory, etcd: Etcd) -> Iterator[Broker]:
    prefix = unique_prefix()
    seed(etcd.endpoint, prefix, IDENTITIES)
    b = start_broker(tmp_path_factory.mktemp("offsets-auth"), etcd, prefix=prefix,
                     FERRY_AUTH="on", FERRY_BROKER_DEFAULT_QUEUES="4",
                     FERRY_BROKER_OFFSETS_MAX_PER_IDENTITY=str(PER_IDENTITY))
    yield b
    b.proc.stop()
    print(b.proc.log()[-5000:])


@pytest.fixture
async def conns(broker: Broker) -> AsyncIterator[dict[str, BrokerConnection]]:
    opened = {key: await BrokerConnection.open(f"127.0.0.1:{broker.port}",
                                               credentials=creds(key)) for key in IDENTITIES}
    yield opened
    for conn in opened.values():
        await conn.close()


async def put(conns: dict[str, BrokerConnection], topic: str, queue_id: int, count: int) -> None:
    await conns["producer"].request(RequestCode.SEND, {"topic": topic, "queue_id": queue_id},
                                    encode_messages([message(b"x")] * count))


async def commit(conn: BrokerConnection, group: str, topic: str, queue_id: int,
                 offset: int) -> None:
    await conn.request(RequestCode.COMMIT_OFFSET, {"group": group, "topic": topic,
                                                   "queue_id": queue_id, "offset": offset})


async def committed(conn: BrokerConnection, group: str, topic: str, queue_id: int) -> int:
    resp = await conn.request(RequestCode.QUERY_OFFSET,
                              {"group": group, "topic": topic, "queue_id": queue_id})
    return int(resp.fields["offset"])


async def test_commits_only_for_queues_that_exist_and_not_past_their_end(
        conns: dict[str, BrokerConnection]) -> None:
    flooder = conns["flooder"]
    with pytest.raises(TopicNotFoundError):
        await commit(flooder, "gf", "no-such-topic", 0, 0)
    await put(conns, "real", 0, 3)   # auto-created with 4 queues
    with pytest.raises(TopicNotFoundError):
        await commit(flooder, "gf", "real", 7, 0)
    with pytest.raises(TopicNotFoundError):   # its retry topic does not exist (yet)
        await commit(flooder, "gf", "%RETRY%gf", 0, 0)
    assert await committed(flooder, "gf", "no-such-topic", 0) == -1
    assert await committed(flooder, "gf", "real", 7) == -1
    await commit(flooder, "gf", "real", 0, 2)
    assert await committed(flooder, "gf", "real", 0) == 2
    await commit(flooder, "gf", "real", 0, 1_000_000)   # past the end (3): lowered to it
    assert await committed(flooder, "gf", "real", 0) == 3
    await commit(flooder, "gf", "real", 1, 0)   # a configured queue with no message yet
    assert await committed(flooder, "gf", "real", 1) == 0


async def test_an_identity_that_floods_is_refused_alone(
        conns: dict[str, BrokerConnection]) -> None:
    flooder, other = conns["flooder"], conns["other"]
    queues = [(f"flood{i}", q) for i in range(4) for q in range(4)]   # 16 queues that exist
    for topic, _ in queues[::4]:
        await put(conns, topic, 0, 1)
    refused = 0
    for topic, queue_id in queues:
        try:
            await commit(flooder, "gf", topic, queue_id, 0)
        except AccessDeniedError as exc:
            assert "OFFSETS_MAX_PER_IDENTITY" in str(exc)
            refused += 1
    assert refused == len(queues) - PER_IDENTITY
    assert await committed(flooder, "gf", *queues[-1]) == -1
    await commit(flooder, "gf", "flood0", 0, 1)   # its existing entries still move
    assert await committed(flooder, "gf", "flood0", 0) == 1
    await commit(other, "go", "flood0", 0, 1)    # another group's first commit
    assert await committed(other, "go", "flood0", 0) == 1


# -- offset resets (issue 25): the right they need, the refusal while the group has live
# members, and the PULL answer that moves a live member while its stale commits are ignored.

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
