"""Election against a real etcd: one leader, growing epochs, resignation, lost leases, eligibility."""
from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
from ferry.routing import EtcdRegistry
from ferry.routing.election import Election

from tests.support.procs import Etcd, start_etcd

from .conftest import eventually
from .etcd_restart import restart_etcd

TTL_S = 2
POLL_S = 0.2


def make(endpoint: str | EtcdRegistry, prefix: str, node: str, *,
         eligible: Callable[[], Awaitable[bool]] | None = None,
         changes: list[bool] | None = None) -> Election:
    return Election(endpoint, prefix, "election/test", node, {"addr": f"host-{node}"}, TTL_S,
                    eligible=eligible, poll_s=POLL_S,
                    on_change=changes.append if changes is not None else None)


@pytest.fixture
async def trio(etcd: Etcd, prefix: str) -> AsyncIterator[list[Election]]:
    nodes = [make(etcd.endpoint, prefix, str(i)) for i in range(3)]
    for e in nodes:
        await e.start()
    yield nodes
    for e in nodes:
        await e.stop()


def leaders(nodes: list[Election]) -> list[Election]:
    return [e for e in nodes if e.is_leader]


async def test_one_leader_among_candidates_and_all_see_it(trio: list[Election]) -> None:
    await eventually(lambda: len(leaders(trio)) == 1)
    leader = leaders(trio)[0]
    await eventually(lambda: all(e.leader is not None and e.leader.node_id == leader.node_id
                                 for e in trio))
    # The others see its value and its term's epoch.
    other = next(e for e in trio if e is not leader)
    assert other.leader is not None
    assert other.leader.value == {"addr": f"host-{leader.node_id}"}
    assert other.epoch == leader.epoch >= 1
    # It stays the only leader past several lease TTLs (keep-alives hold it).
    await asyncio.sleep(TTL_S * 2)
    assert leaders(trio) == [leader]


async def test_resign_frees_the_key_at_once_and_the_next_term_has_epoch_plus_one(
        trio: list[Election]) -> None:
    await eventually(lambda: len(leaders(trio)) == 1)
    first = leaders(trio)[0]
    epoch = first.epoch
    await first.stop()
    assert not first.is_leader
    rest = [e for e in trio if e is not first]
    # Revoking the lease deletes the key now: a poll round, not a TTL, later.
    started = time.monotonic()
    await eventually(lambda: len(leaders(rest)) == 1, timeout_s=TTL_S * 0.9 + 1)
    assert time.monotonic() - started < TTL_S
    second = leaders(rest)[0]
    assert second.epoch == epoch + 1
    await eventually(lambda: all(e.epoch == epoch + 1 for e in rest))


async def test_epochs_strictly_increase_across_terms(etcd: Etcd, prefix: str) -> None:
    seen: list[int] = []
    for term in range(4):
        e = make(etcd.endpoint, prefix, f"n{term % 2}")
        await e.start()
        await e.wait_leading()
        seen.append(e.epoch)
        await e.stop()
    assert seen == sorted(set(seen)) and len(seen) == 4
    assert all(b == a + 1 for a, b in zip(seen, seen[1:], strict=False))


async def test_changes_are_reported_to_on_change(etcd: Etcd, prefix: str) -> None:
    changes: list[bool] = []
    e = make(etcd.endpoint, prefix, "solo", changes=changes)
    await e.start()
    await e.wait_leading()
    await e.stop()
    assert changes == [True, False]


async def test_a_revoked_lease_ends_leadership_by_safe_until(etcd: Etcd, prefix: str) -> None:
    reg = EtcdRegistry(etcd.endpoint, prefix=prefix)
    await reg.start()
    a = make(etcd.endpoint, prefix, "a")
    b = make(etcd.endpoint, prefix, "b")
    try:
        await a.start()
        await a.wait_leading()
        await b.start()
        await eventually(lambda: b.leader is not None)
        epoch = a.epoch
        assert a.lease_id is not None
        # Someone (an operator, a bug) revokes the leader's lease behind its back.
        await reg.client.revoke_lease(a.lease_id)
        deadline = a.safe_until
        await eventually(lambda: not a.is_leader, timeout_s=TTL_S + 1)
        assert time.monotonic() <= deadline + TTL_S / 3 + 0.5  # noticed at its next refresh
        await eventually(lambda: b.is_leader or a.is_leader, timeout_s=TTL_S * 3)
        winner = a if a.is_leader else b
        assert winner.epoch == epoch + 1
    finally:
        await a.stop()
        await b.stop()
        await reg.stop()


async def test_a_leader_cut_off_from_etcd_stops_leading_by_safe_until(tmp_path: Path) -> None:
    """etcd stops: the leader cannot refresh, and is_leader turns False by safe_until."""
    own = start_etcd(tmp_path / "etcd")
    e = make(own.endpoint, "/own/", "x")
    try:
        await e.start()
        await e.wait_leading()
        first = e.epoch
        own.proc.stop()
        # is_leader is checked against the clock: it is False from safe_until on,
        # whatever the loop is doing (here: waiting on an etcd that does not answer).
        safe_until = e.safe_until
        assert safe_until <= time.monotonic() + TTL_S * 2 / 3 + 0.01
        while time.monotonic() < safe_until + 0.05:
            await asyncio.sleep(0.05)
        assert not e.is_leader
        await asyncio.sleep(TTL_S)
        assert not e.is_leader  # no leadership without etcd, however long
        # etcd returns: the candidate leads again, in a new term.
        await restart_etcd(own, tmp_path / "etcd")
        await asyncio.wait_for(e.wait_leading(), 20)
        assert e.epoch == first + 1
    finally:
        await e.stop()
        own.proc.stop()


async def test_an_ineligible_candidate_waits_while_an_eligible_one_takes_the_key(
        etcd: Etcd, prefix: str) -> None:
    asked = 0
    allow = False

    async def eligible() -> bool:
        nonlocal asked
        asked += 1
        return allow

    shy = make(etcd.endpoint, prefix, "shy", eligible=eligible)
    await shy.start()
    try:
        await eventually(lambda: asked >= 3)
        assert not shy.is_leader  # the key is free, yet it declined each round
        keen = make(etcd.endpoint, prefix, "keen")
        await keen.start()
        await keen.wait_leading()
        asked_then = asked
        await asyncio.sleep(POLL_S * 5)
        # With a leader holding the key, eligibility is not even asked.
        assert asked == asked_then
        await keen.stop()
        allow = True
        await asyncio.wait_for(shy.wait_leading(), 5)
    finally:
        await shy.stop()


async def test_bad_arguments_are_refused(etcd: Etcd, prefix: str) -> None:
    with pytest.raises(ValueError):
        Election(etcd.endpoint, prefix, "k", "n", {}, 1)
    with pytest.raises(ValueError):
        Election(etcd.endpoint, prefix, "k", "n", {"epoch": 3}, TTL_S)


async def test_only_the_current_leader_can_put_if_leader(etcd: Etcd, prefix: str) -> None:
    """A deposed leader's write is refused by etcd, even before it noticed its loss."""
    reg = EtcdRegistry(etcd.endpoint, prefix=prefix)
    await reg.start()
    a = make(etcd.endpoint, prefix, "a")
    b = make(etcd.endpoint, prefix, "b")
    key = f"{prefix}insync/test"
    try:
        await a.start()
        await a.wait_leading()
        assert not await b.put_if_leader(key, b"from b")  # not leading
        assert await a.put_if_leader(key, b"term 1")
        got = await reg.client.get(key.encode())
        assert got is not None and got.value == b"term 1"
        # a is deposed behind its back: its key goes and b takes a new term.
        await reg.client.delete(a.key)
        await b.start()
        await b.wait_leading()
        # Whether or not a noticed yet (it checks its key once per TTL/3), etcd
        # compares the leader key's create_revision with a's: refused.
        assert not await a.put_if_leader(key, b"stale")
        assert await b.put_if_leader(key, b"term 2")
        got = await reg.client.get(key.encode())
        assert got is not None and got.value == b"term 2"
    finally:
        await a.stop()
        await b.stop()
        await reg.stop()
