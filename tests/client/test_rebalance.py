"""Queue allocation: every queue to exactly one member, deterministic, balanced, contiguous."""
from __future__ import annotations

from ferry.client.message import TopicQueue
from ferry.client.rebalance import allocate_all, allocate_averagely
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
