"""Queue allocation strategies: which queues of a topic each member of a consumer group owns.

Every member computes its share on its own from the same inputs (the topic's
queues and the group's member ids), so every member computing them gets a
disjoint cover of all queues, with no coordinator. The order of the queues
never matters; the order of the members matters to `consistent_hash` only,
which takes them in join order (below), so the members must agree on that
order as they agree on the member list.

`average` (RocketMQ's "averagely"): the sorted queues cut into contiguous
ranges, member i of the sorted members taking range i, the first
`len(queues) % len(members)` members one queue more. Perfectly balanced, but
a member joining shifts every range after it: up to about half the queues move.

`consistent_hash` ("join-order sticky balancing"): a function of the members
in the order they JOINED the group (the Sequence as given; the rebalance gets
it from the brokers, which report each member's start time, `joined_ms`).
The first member starts with every queue; each next member, the k-th, takes
`floor(queues / k)` queues, one at a time, each from the member holding the
most at that moment (ties broken by a stable hash of the newcomer and donor
ids), choosing the donor's queue that scores highest with the newcomer (a
64-bit BLAKE2b hash of both names). So shares stay within one queue of each
other, and replaying the joins is how every member computes the same answer.
A member joining at the end of the order moves exactly `floor(queues /
members)` queues (all to itself), within the bound `ceil(queues / members) +
1` for every set of ids; a member leaving re-runs the replay without it,
which moves its queues plus usually a few more (on random groups fewer extra
moves than `average`).
"""
from __future__ import annotations

import functools
import hashlib
import heapq
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

Q = TypeVar("Q")

#: Distinct (queues, members) inputs whose consistent_hash shares are kept: one per
#: subscribed topic is enough for a consumer, whose rebalance asks again every few seconds.
SHARES_CACHE_SIZE = 64

#: The strategies a Consumer accepts as `allocation=`.
STRATEGIES = ("average", "consistent_hash")

#: (queues, members, me) -> the queues `me` owns
Allocator = Callable[[Sequence[Any], Sequence[str], str], list[Any]]


def allocate_averagely(queues: Sequence[Q], members: Sequence[str], me: str) -> list[Q]:
    """The queues `me` owns: a contiguous range of the sorted queues; [] if not a member."""
    qs = sorted(queues)  # type: ignore[type-var]
    ms = sorted(set(members))
    if me not in ms or not qs:
        return []
    idx = ms.index(me)
    base, extra = divmod(len(qs), len(ms))
    start = idx * base + min(idx, extra)
    count = base + (1 if idx < extra else 0)
    return qs[start:start + count]


def _score(member: str, queue: object) -> int:
    """The rendezvous score of a (member, queue) pair: stable across processes and versions."""
    data = f"{member}\x00{queue}".encode("utf-8", "surrogatepass")
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


def _dedup(members: Iterable[str]) -> list[str]:
    """The members in the order given, each once (its first place)."""
    return list(dict.fromkeys(members))


def _take_for(newcomer: str, shares: dict[str, list[int]], names: Sequence[str],
              count: int) -> list[int]:
    """Move `count` queues (indexes into `names`) to `newcomer`, each from the most loaded member.

    A donor's queues are sorted by their score with the newcomer when it first
    gives one, and given away best first: a donor only loses queues during one
    join, so its best remaining queue is always the next of that list. A heap
    of donors by (size, tie score) picks the most loaded one for each queue;
    with many members most give nothing, and their queues are never scored.
    """
    def score(name: str) -> int:   # _score(newcomer, queue), without formatting the queue again
        data = f"{newcomer}\x00{name}".encode("utf-8", "surrogatepass")
        return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")

    given: dict[str, int] = {}
    heap = [(-len(qs), -_score(newcomer, m), m) for m, qs in shares.items()]
    heapq.heapify(heap)
    taken: list[int] = []
    while len(taken) < count:
        size, tie, donor = heapq.heappop(heap)
        if donor not in given:
            shares[donor].sort(key=lambda i: (score(names[i]), -i), reverse=True)
            given[donor] = 0
        taken.append(shares[donor][given[donor]])
        given[donor] += 1
        heapq.heappush(heap, (size + 1, tie, donor))
    for m, n in given.items():
        del shares[m][:n]
    return taken


def consistent_hash_shares(queues: Iterable[Q], members: Iterable[str]) -> dict[str, list[Q]]:
    """Every member's share by join-order sticky balancing (each list sorted).

    `members` are in join order (the first joined first); the result depends
    on that order and not on the order of `queues`.
    """
    qs: list[Q] = sorted(set(queues))  # type: ignore[type-var]
    shares = _shares(tuple(str(q) for q in qs), tuple(_dedup(members)))
    return {m: [qs[i] for i in share] for m, share in shares.items()}


@functools.lru_cache(maxsize=SHARES_CACHE_SIZE)
def _shares(names: tuple[str, ...], members: tuple[str, ...]) -> dict[str, tuple[int, ...]]:
    """The replay of the joins over queue indexes (cached: each rebalance asks again)."""
    if not members:
        return {}
    shares = {members[0]: list(range(len(names)))}
    for k, newcomer in enumerate(members[1:], start=2):
        shares[newcomer] = _take_for(newcomer, shares, names, len(names) // k)
    return {m: tuple(sorted(share)) for m, share in shares.items()}


def allocate_consistent_hash(queues: Sequence[Q], members: Sequence[str], me: str) -> list[Q]:
    """The queues `me` owns, `members` in join order; [] if not a member."""
    return consistent_hash_shares(queues, members).get(me, [])


_ALLOCATORS: dict[str, Allocator] = {
    "average": allocate_averagely,
    "consistent_hash": allocate_consistent_hash,
}


def allocator(name: str) -> Allocator:
    """The allocation function of strategy `name`; ValueError for an unknown name."""
    try:
        return _ALLOCATORS[name]
    except KeyError:
        raise ValueError(f"allocation must be one of {', '.join(STRATEGIES)}; got {name!r}") \
            from None


def allocate_all(queues: Sequence[Q], members: Iterable[str],
                 strategy: str = "average") -> dict[str, list[Q]]:
    """Every member's share under `strategy`, `members` in join order (tests, admin view)."""
    ms = _dedup(members)   # in join order: consistent_hash depends on it, average sorts
    if strategy == "consistent_hash":
        return consistent_hash_shares(queues, ms)
    allocate = allocator(strategy)
    return {m: allocate(queues, ms, m) for m in ms}
