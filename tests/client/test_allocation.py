"""Allocation strategies: disjoint balanced covers, and how many queues a join or leave moves."""
from __future__ import annotations

import math
import random

import pytest
from ferry import Consumer
from ferry.client.consuming.allocation import (
    STRATEGIES,
    allocate_all,
    allocate_averagely,
    allocate_consistent_hash,
    allocator,
)
from ferry.client.core.message import TopicQueue
from hypothesis import given, settings
from hypothesis import strategies as st

member_sets = st.lists(st.text(min_size=1, max_size=12), unique=True, min_size=1, max_size=10)
queue_counts = st.integers(1, 64)


def _queues(n: int, brokers: int = 2) -> list[TopicQueue]:
    return [TopicQueue("t", f"broker-{i % brokers}", i // brokers) for i in range(n)]


def _moves(before: dict[str, list[TopicQueue]], after: dict[str, list[TopicQueue]]) -> int:
    owner = {q: m for m, qs in before.items() for q in qs}
    return sum(1 for m, qs in after.items() for q in qs if owner[q] != m)


# Consumer-style ids: host@pid@random hex, as `Consumer` makes them when none is given.
consumer_ids = st.builds(lambda host, pid, tail: f"{host}@{pid}@{tail:08x}",
                         st.sampled_from(["h1", "h2", "worker-7"]), st.integers(1, 99_999),
                         st.integers(0, 2**32 - 1))
join_orders = st.one_of(st.lists(consumer_ids, unique=True, min_size=1, max_size=10),
                        member_sets)


def _check_cover(shares: dict[str, list[TopicQueue]], queues: list[TopicQueue]) -> None:
    """Every queue owned by exactly one member, shares within one queue of each other."""
    owned = [q for share in shares.values() for q in share]
    assert sorted(owned) == sorted(queues) and len(owned) == len(set(owned))
    sizes = [len(share) for share in shares.values()]
    assert max(sizes) - min(sizes) <= 1


@settings(max_examples=1000, deadline=None)
@given(join_orders, queue_counts, st.randoms(use_true_random=False))
def test_consistent_hash_every_member_computes_a_disjoint_balanced_cover(
        members: list[str], n: int, rnd: random.Random) -> None:
    queues = _queues(n)
    # each member computes its own share from the queues in its own order
    shares = {}
    for m in members:
        qs = list(queues)
        rnd.shuffle(qs)
        shares[m] = allocate_consistent_hash(qs, members, m)
    _check_cover(shares, queues)
    assert shares == allocate_all(queues, members, "consistent_hash")
    assert allocate_consistent_hash(queues, members, "not-a-member") == []
    # a duplicate id counts once, at its first place in the join order
    assert allocate_all(queues, [*members, members[0]], "consistent_hash") == shares


@settings(max_examples=3000, deadline=None)
@given(join_orders, queue_counts, consumer_ids)
def test_consistent_hash_join_moves_at_most_ceil_queues_per_member_plus_one(
        members: list[str], n: int, newcomer: str) -> None:
    """The issue's bound, for every join: the newcomer joins last (it started last)."""
    if newcomer in members:
        return
    queues = _queues(n)
    before = allocate_all(queues, members, "consistent_hash")
    after = allocate_all(queues, [*members, newcomer], "consistent_hash")
    _check_cover(after, queues)
    moved = _moves({**before, newcomer: []}, after)
    assert moved <= math.ceil(n / (len(members) + 1)) + 1
    # only the newcomer gains: every moved queue went to it
    assert moved == len(after[newcomer]) == n // (len(members) + 1)


@settings(max_examples=1000, deadline=None)
@given(join_orders, queue_counts, st.data())
def test_consistent_hash_leave_moves_the_leavers_queues_and_a_few_more(
        members: list[str], n: int, data: st.DataObject) -> None:
    """A member leaving: the others replay the joins without it, still a balanced cover."""
    leaver = data.draw(st.sampled_from(members))
    rest = [m for m in members if m != leaver]
    queues = _queues(n)
    before = allocate_all(queues, members, "consistent_hash")
    after = allocate_all(queues, rest, "consistent_hash")
    if rest:
        _check_cover(after, queues)
        assert _moves(before, after) >= len(before[leaver])
    else:
        assert after == {}


def test_consistent_hash_moves_fewer_queues_than_average() -> None:
    """Over 3,000 random groups (1-10 members after the change, 1-64 queues): joins and
    leaves together move far fewer queues than `average`; a leave moves, beyond the
    leaver's own queues, fewer extra ones than `average` does."""
    rnd = random.Random(8)
    hashed = averaged = hashed_extra = averaged_extra = 0
    for _ in range(3000):
        n, size = rnd.randint(1, 64), rnd.randint(1, 9)
        members = list(dict.fromkeys(
            f"host{rnd.randrange(100)}@{rnd.randrange(1 << 16)}@{rnd.getrandbits(32):08x}"
            for _ in range(size + 1)))
        queues = _queues(n)
        for strategy in STRATEGIES:
            joined = _moves(allocate_all(queues, members[:-1], strategy),
                            allocate_all(queues, members, strategy))
            leaver = rnd.choice(members)
            full = allocate_all(queues, members, strategy)
            extra = _moves(full, allocate_all(queues, [m for m in members if m != leaver],
                                              strategy)) - len(full[leaver])
            if strategy == "consistent_hash":
                hashed, hashed_extra = hashed + joined + extra, hashed_extra + extra
            else:
                averaged, averaged_extra = averaged + joined + extra, averaged_extra + extra
    assert hashed <= 0.6 * averaged
    assert hashed_extra < averaged_extra


def test_consistent_hash_scales_to_a_thousand_queues_and_hundreds_of_members() -> None:
    """Large groups replay quickly enough to rebalance (no quadratic blow-up), and balance."""
    queues = _queues(1024, brokers=4)
    members = [f"host@{i}@{i * 2654435761 % (1 << 32):08x}" for i in range(300)]
    shares = allocate_all(queues, members, "consistent_hash")
    _check_cover(shares, queues)
    grown = allocate_all(queues, [*members, "late@1@00000000"], "consistent_hash")
    assert _moves({**shares, "late@1@00000000": []}, grown) == 1024 // 301


def test_average_is_unchanged_and_reexported_from_rebalance() -> None:
    from ferry.client.consuming import rebalance
    assert rebalance.allocate_averagely is allocate_averagely
    qs = _queues(8, brokers=1)
    assert [q.queue_id for q in allocate_averagely(qs, ["m2", "m1"], "m1")] == [0, 1, 2, 3]


def test_unknown_strategy_is_refused() -> None:
    assert set(STRATEGIES) == {"average", "consistent_hash"}
    assert allocator("consistent_hash") is allocate_consistent_hash
    with pytest.raises(ValueError, match="allocation must be one of"):
        allocator("sticky")
    with pytest.raises(ValueError, match="allocation must be one of"):
        Consumer("t", group="g", allocation="round_robin")
    assert Consumer("t", group="g", allocation="consistent_hash").allocation == "consistent_hash"
