"""Queue allocation strategies: which queues of a topic each member of a consumer group owns.

Every member computes its share on its own from the same inputs (the topic's
queues and the group's member ids), so the strategies are pure functions of
the two SETS: input order never matters, and every member computing them gets
a disjoint cover of all queues, with no coordinator.

`average` (RocketMQ's "averagely"): the sorted queues cut into contiguous
ranges, member i of the sorted members taking range i, the first
`len(queues) % len(members)` members one queue more. Perfectly balanced, but
a member joining shifts every range after it: up to about half the queues move.

`consistent_hash`: rendezvous hashing with bounded loads. Every (member,
queue) pair gets a score, a hash of both names; the pairs are taken best score
first and a queue goes to the member of its pair unless the queue is taken or
the member already holds `ceil(queues / members) + LOAD_SLACK` (the cap).
Without the cap this is plain rendezvous hashing, where a joining member takes
only the queues it scores best on and nothing else moves, but shares vary by
chance (one of two members may get 40 of 64 queues). The cap bounds every
share, at the price of a few extra moves when a share that hit the cap changes;
one queue of slack above the even share halves those extra moves (a tighter cap
moves more, a looser one balances worse). Measured over random member sets
(1-10 members, 1-64 queues, tests/client/test_allocation.py), a join moves on
average fewer queues than `ceil(queues / members_after) + 1` and about 40%
fewer than `average`; no allocation computed from the member set alone can
promise that bound for EVERY set of member ids (docs/client.md, "Allocation
strategies", says why).
"""
from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

Q = TypeVar("Q")

#: Queues a consistent_hash share may hold above the even share ceil(queues / members).
LOAD_SLACK = 1

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


def consistent_hash_shares(queues: Iterable[Q], members: Iterable[str]) -> dict[str, list[Q]]:
    """Every member's share by rendezvous hashing with bounded loads (each list sorted)."""
    qs = sorted(set(queues))  # type: ignore[type-var]
    ms = sorted(set(members))
    shares: dict[str, list[Q]] = {m: [] for m in ms}
    if not ms or not qs:
        return shares
    cap = -(-len(qs) // len(ms)) + LOAD_SLACK
    # Ties (equal 64-bit scores) fall back to the names, so the order is total.
    pairs = sorted(((_score(m, q), m, i) for m in ms for i, q in enumerate(qs)), reverse=True)
    owner: list[str | None] = [None] * len(qs)
    left = len(qs)
    for _, m, i in pairs:
        if owner[i] is None and len(shares[m]) < cap:
            owner[i] = m
            shares[m].append(qs[i])
            left -= 1
            if not left:
                break
    for share in shares.values():
        share.sort()  # type: ignore[type-var]
    return shares


def allocate_consistent_hash(queues: Sequence[Q], members: Sequence[str], me: str) -> list[Q]:
    """The queues `me` owns by rendezvous hashing with bounded loads; [] if not a member."""
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
    """Every member's share under `strategy` (used by tests and the admin view)."""
    ms = sorted(set(members))
    if strategy == "consistent_hash":
        return consistent_hash_shares(queues, ms)
    allocate = allocator(strategy)
    return {m: allocate(queues, ms, m) for m in ms}
