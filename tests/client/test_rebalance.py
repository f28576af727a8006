"""Queue allocation: every queue to exactly one member, deterministic, balanced, contiguous."""
from __future__ import annotations

from typing import Any

from ferry.client.consuming.rebalance import GroupMembership, allocate_all, allocate_averagely
from ferry.client.core.message import TopicQueue
from ferry.client.core.namesrv import BrokerRoute, TopicRoute
from ferry.errors import ConnectionLostError, FerryError
from ferry.wire import Frame, RequestCode, request, response
from hypothesis import given
from hypothesis import strategies as st

queue_lists = st.lists(
    st.builds(TopicQueue, st.just("t"), st.sampled_from(["broker-a", "broker-b", "broker-c"]),
              st.integers(0, 15)), unique=True, max_size=40)
member_lists = st.lists(st.text(min_size=1, max_size=8), unique=True, min_size=1, max_size=12)


@given(queue_lists, member_lists)
def test_every_queue_goes_to_exactly_one_member(queues: list[TopicQueue],
                                                members: list[str]) -> None:
    shares = allocate_all(queues, members)
    owned = [q for share in shares.values() for q in share]
    assert sorted(owned) == sorted(queues)
    assert len(owned) == len(set(owned))


@given(queue_lists, member_lists, st.randoms())
def test_allocation_is_deterministic_whatever_the_input_order(
        queues: list[TopicQueue], members: list[str], rnd) -> None:  # type: ignore[no-untyped-def]
    shuffled_q, shuffled_m = list(queues), list(members)
    rnd.shuffle(shuffled_q)
    rnd.shuffle(shuffled_m)
    for m in members:
        assert allocate_averagely(queues, members, m) == allocate_averagely(shuffled_q, shuffled_m, m)


@given(queue_lists, member_lists)
def test_allocation_is_balanced_and_contiguous(queues: list[TopicQueue], members: list[str]) -> None:
    shares = allocate_all(queues, members)
    sizes = [len(s) for s in shares.values()]
    assert max(sizes) - min(sizes) <= 1
    ordered = sorted(queues)
    for share in shares.values():
        if share:
            start = ordered.index(share[0])
            assert ordered[start:start + len(share)] == share


def test_non_member_gets_nothing_and_examples() -> None:
    qs = [TopicQueue("t", "a", i) for i in range(8)]
    assert allocate_averagely(qs, ["m1", "m2"], "m3") == []
    shares = allocate_all(qs, ["m3", "m1", "m2"])
    assert [q.queue_id for q in shares["m1"]] == [0, 1, 2]
    assert [q.queue_id for q in shares["m2"]] == [3, 4, 5]
    assert [q.queue_id for q in shares["m3"]] == [6, 7]
    assert allocate_averagely(qs[:2], ["a", "b", "c"], "c") == []


class _FakePool:
    """GET_CONSUMERS answers per broker address (a dict of fields, or an error)."""

    def __init__(self, answers: dict[str, dict[str, Any] | FerryError]) -> None:
        self.answers = answers
        self.sent: list[tuple[str, int, dict[str, Any]]] = []

    async def request(self, addr: str, code: int, fields: dict[str, Any]) -> Frame:
        self.sent.append((addr, code, fields))
        answer = self.answers.get(addr, {})
        if isinstance(answer, FerryError):
            raise answer
        return response(request(code, 1), answer if code == RequestCode.GET_CONSUMERS else {})


def _membership(answers: dict[str, dict[str, Any] | FerryError]) -> GroupMembership:
    pool = _FakePool(answers)
    gm = GroupMembership(pool, None, client_id="me", group="g",  # type: ignore[arg-type]
                         topics=["t"], mode="clustering")
    gm.joined_ms = 5_000
    return gm


_ROUTE = TopicRoute("t", "normal", "rw", (BrokerRoute("a", "c", "addr-a", 4),
                                          BrokerRoute("b", "c", "addr-b", 4),
                                          BrokerRoute("down", "c", "addr-down", 4)))


async def test_members_come_in_join_order_over_every_broker() -> None:
    """Ordered by (joined_ms, id) over the union of the brokers' answers, ourselves included;
    a broker without joined_ms (older) counts 0 and does not override a known time."""
    gm = _membership({
        "addr-a": {"members": ["zed", "amy", "me"], "joined_ms": [1_000, 9_000, 5_000]},
        "addr-b": {"members": ["amy", "bob", "old"]},   # an older broker: no joined_ms
        "addr-down": ConnectionLostError("down"),
    })
    assert await gm.members(_ROUTE) == ["bob", "old", "zed", "me", "amy"]


async def test_members_include_ourselves_before_our_heartbeat_arrives() -> None:
    gm = _membership({"addr-a": {"members": ["x"], "joined_ms": [7_000]}})
    assert await gm.members(_ROUTE) == ["me", "x"]
    none_answer = _membership({a: ConnectionLostError("down")
                               for a in ("addr-a", "addr-b", "addr-down")})
    assert await none_answer.members(_ROUTE) == []


async def test_heartbeat_carries_joined_ms() -> None:
    gm = _membership({})
    await gm.heartbeat([_ROUTE])
    sent = [f for _, code, f in gm.pool.sent if code == RequestCode.HEARTBEAT]  # type: ignore[attr-defined]
    assert len(sent) == 3 and all(f["joined_ms"] == 5_000 for f in sent)
