"""Client failover choices without processes: where pulls, commits and sends go.

`ReadChoice` (master or slave for a queue's pulls) runs on a fake clock; the
producer and the fetcher talk to in-process stand-ins for brokers and namesrv,
so that the route can change exactly between two requests, as in a failover.
"""
from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any, NamedTuple

import pytest
from ferry.client.consuming.fetcher import FetchConfig, QueueFetcher
from ferry.client.core.message import TopicQueue
from ferry.client.core.namesrv import MIN_REFRESH_INTERVAL_MS, BrokerRoute, RouteCache, TopicRoute
from ferry.client.core.replicas import MASTER_DOWN_MS, SUGGEST_SLAVE_MS, ReadChoice
from ferry.client.producing.producer import Producer
from ferry.errors import ConnectionLostError, NotMasterError, SlaveNotAvailableError

M, S1, S2, M2 = "10.0.0.1:1", "10.0.0.2:1", "10.0.0.3:1", "10.0.0.4:1"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _group(master: str | None = M, slaves: tuple[str, ...] = (S1,)) -> BrokerRoute:
    return BrokerRoute("broker-a", "c", master, 4, slaves=slaves)


# -- ReadChoice ---------------------------------------------------------------------------------
def test_reads_from_the_master_while_it_serves() -> None:
    choice = ReadChoice(clock=Clock())
    assert choice.choose(_group()) == M
    choice.on_answer(M, _group(), found=True, suggest_slave=False)
    assert choice.choose(_group()) == M and not choice.reading_from_slave(_group())


def test_no_master_in_the_route_reads_from_a_slave_and_back_when_one_is_elected() -> None:
    choice = ReadChoice(clock=Clock())
    assert choice.choose(_group(master=None)) == S1
    # the slave won the election: the route names it master, with no slave left
    assert choice.choose(_group(master=S1, slaves=())) == S1
    # the old master rejoined as a slave: reads stay on the (new) master
    assert choice.choose(_group(master=S1, slaves=(M,))) == S1


def test_an_unreachable_master_is_skipped_for_a_while_then_tried_again() -> None:
    clock = Clock()
    choice = ReadChoice(clock=clock)
    choice.on_failure(M, _group())
    assert choice.choose(_group()) == S1
    clock.now += MASTER_DOWN_MS / 1000 - 0.01
    assert choice.choose(_group()) == S1
    clock.now += 0.02
    assert choice.choose(_group()) == M
    # a different master in the route (failover done) is used at once
    choice.on_failure(M, _group())
    assert choice.choose(_group(master=M2)) == M2


def test_commits_go_to_the_master_unless_it_is_gone_or_failed() -> None:
    clock = Clock()
    choice = ReadChoice(clock=clock)
    assert choice.commit_target(_group()) == M
    choice.on_answer(M, _group(), found=True, suggest_slave=True)
    assert choice.commit_target(_group()) == M          # on the slave by suggestion only
    assert choice.commit_target(_group(master=None)) == S1
    choice.on_failure(M, _group())
    clock.now += MASTER_DOWN_MS   # even once the master is tried again, until it answers
    assert choice.commit_target(_group()) == S1
    choice.on_answer(M, _group(), found=False, suggest_slave=False)
    assert choice.commit_target(_group()) == M
    assert choice.commit_target(_group(slaves=())) == M and choice.commit_target(None) is None


def test_a_failing_slave_rotates_to_the_next() -> None:
    choice = ReadChoice(clock=Clock())
    group = _group(master=None, slaves=(S1, S2))
    assert choice.choose(group) == S1
    choice.on_failure(S1, group)
    assert choice.choose(group) == S2
    choice.on_failure(S2, group)
    assert choice.choose(group) == S1


def test_no_slave_means_the_master_whatever_its_state() -> None:
    choice = ReadChoice(clock=Clock())
    choice.on_failure(M, _group(slaves=()))
    assert choice.choose(_group(slaves=())) == M
    assert choice.choose(_group(master=None, slaves=())) is None
    assert choice.choose(None) is None


def test_suggest_slave_holds_until_caught_up_on_the_slave() -> None:
    clock = Clock()
    choice = ReadChoice(clock=clock)
    choice.on_answer(M, _group(), found=True, suggest_slave=True)
    assert choice.choose(_group()) == S1
    choice.on_answer(S1, _group(), found=True, suggest_slave=False)
    assert choice.choose(_group()) == S1
    choice.on_answer(S1, _group(), found=False, suggest_slave=False)   # caught up
    assert choice.choose(_group()) == M
    choice.on_answer(M, _group(), found=True, suggest_slave=False)    # no longer suggested
    assert choice.choose(_group()) == M


def test_suggest_slave_expires_and_needs_a_slave() -> None:
    clock = Clock()
    choice = ReadChoice(clock=clock)
    choice.on_answer(M, _group(), found=True, suggest_slave=True)
    clock.now += SUGGEST_SLAVE_MS / 1000 + 0.01
    assert choice.choose(_group()) == M
    choice.on_answer(M, _group(slaves=()), found=True, suggest_slave=True)
    assert choice.choose(_group(slaves=())) == M


# -- RouteCache rate limit ----------------------------------------------------------------------
class _Namesrv:
    """Answers get_route from `routes` (the last one repeats) and counts the calls."""

    def __init__(self, *routes: TopicRoute) -> None:
        self.routes = list(routes)
        self.calls = 0

    async def get_route(self, topic: str, *, create: bool = False) -> TopicRoute:
        self.calls += 1
        return self.routes.pop(0) if len(self.routes) > 1 else self.routes[0]


def _route(*groups: BrokerRoute) -> TopicRoute:
    return TopicRoute("t", "normal", "rw", groups)


async def test_invalidate_refreshes_at_most_once_per_min_interval() -> None:
    ns = _Namesrv(_route(_group()))
    cache = RouteCache(ns)  # type: ignore[arg-type]
    await cache.route("t")
    for _ in range(20):
        cache.invalidate("t")
        await cache.route("t")
    assert ns.calls == 1
    await asyncio.sleep(MIN_REFRESH_INTERVAL_MS / 1000 + 0.05)
    cache.invalidate("t")
    await cache.route("t")
    assert ns.calls == 2


def test_a_masterless_group_stays_readable_while_it_has_a_slave() -> None:
    route = _route(_group(master=None), BrokerRoute("broker-b", "c", None, 2))
    assert route.readable_queues() == [("broker-a", q) for q in range(4)]
    assert route.writable_queues() == []


# -- the producer across a failover -------------------------------------------------------------
class FakeFrame(NamedTuple):
    fields: dict[str, Any]


class Group:
    """One broker group: `master` takes writes; every other address refuses with `error`."""

    def __init__(self, master: str, error: type[Exception] = NotMasterError) -> None:
        self.master = master
        self.error = error
        self.stored: list[tuple[str, bytes]] = []
        self.tried: list[str] = []

    async def request(self, addr: str, code: int, fields: Mapping[str, Any],
                      body: bytes = b"") -> FakeFrame:
        self.tried.append(addr)
        if addr != self.master:
            raise self.error(f"{addr} is not master")
        self.stored.append((addr, body))
        return FakeFrame({"queue_offset": len(self.stored) - 1, "queue_id": fields["queue_id"]})


def _producer(ns: _Namesrv, **kw: Any) -> Producer:
    p = Producer(namesrv="127.0.0.1:1", retry_backoff_ms=5, linger_ms=0, **kw)
    p._started = True
    p._routes.client = ns  # type: ignore[assignment]
    return p


@pytest.mark.parametrize("error", [NotMasterError, SlaveNotAvailableError, ConnectionLostError])
@pytest.mark.parametrize("ordered", [True, False])
async def test_a_send_moves_to_the_new_master_of_its_group(error: type[Exception],
                                                          ordered: bool) -> None:
    """The old master refuses; namesrv first shows no master (election), then the new one."""
    ns = _Namesrv(_route(_group()), _route(_group(master=None)),
                  _route(_group(master=S1, slaves=())))
    group = Group(master=S1, error=error)
    p = _producer(ns, retries=200)
    p._pool.request = group.request  # type: ignore[method-assign]
    results = [await asyncio.wait_for(await p.send("t", f"m{i}".encode(), key="k",
                                                   ordered=ordered), 10) for i in range(3)]
    assert all(r.broker == "broker-a" for r in results)
    assert group.tried[0] == M and [a for a, _ in group.stored] == [S1] * 3
    assert p.buffered_bytes == 0
    await p._pool.close()


async def test_a_send_fails_once_retries_are_spent_while_no_master_is_elected() -> None:
    ns = _Namesrv(_route(_group()), _route(_group(master=None)))
    group = Group(master=S1)
    p = _producer(ns, retries=3)
    p._pool.request = group.request  # type: ignore[method-assign]
    for ordered in (True, False):
        fut = await p.send("t", b"x", key="k", ordered=ordered)
        with pytest.raises(NotMasterError):
            await asyncio.wait_for(fut, 10)
    assert not group.stored and p.buffered_bytes == 0


async def test_other_groups_are_not_skipped_by_a_failover_elsewhere() -> None:
    """A plain send that failed on broker-a's old master goes to broker-a's new one too."""
    b = BrokerRoute("broker-b", "c", M2, 4)
    ns = _Namesrv(_route(_group(), b), _route(_group(master=S1, slaves=()), b))
    p = _producer(ns, retries=2)
    p._chooser.mark_faulty("broker-a", M)
    route = await p._routes.route("t")
    assert {p._chooser.round_robin("t", route).broker for _ in range(8)} == {"broker-b"}
    await asyncio.sleep(MIN_REFRESH_INTERVAL_MS / 1000 + 0.05)
    p._routes.invalidate("t")
    route = await p._routes.route("t")
    assert {p._chooser.round_robin("t", route).broker for _ in range(8)} == {"broker-a",
                                                                          "broker-b"}


# -- the fetcher: pulls and commits ------------------------------------------------------------
class PullBroker:
    """Answers PULLs per address: `down` addresses fail, others give `answers[addr]`."""

    def __init__(self, answers: dict[str, dict[str, Any]], down: set[str]) -> None:
        self.answers = answers
        self.down = down
        self.asked: list[str] = []

    async def request(self, addr: str, code: object, fields: Mapping[str, Any],
                      body: bytes = b"", timeout_ms: int | None = None) -> Any:
        self.asked.append(addr)
        if addr in self.down:
            raise ConnectionLostError(f"{addr} is down")
        return type("F", (), {"fields": dict(self.answers[addr]), "body": b""})()


def _fetcher(ns: _Namesrv, pool: PullBroker) -> QueueFetcher:
    cache = RouteCache(ns)  # type: ignore[arg-type]
    return QueueFetcher(tq=TopicQueue("t", "broker-a", 0), pool=pool,  # type: ignore[arg-type]
                        routes=cache, config=FetchConfig(group="g"), wakeup=asyncio.Event(),
                        fetch_offset=0)


async def test_fetcher_reads_from_the_slave_while_the_master_is_down_and_commits_there() -> None:
    empty = {"status": "OFFSET_OVERFLOW_ONE", "next_offset": 0}
    pool = PullBroker({M: empty, S1: empty}, down={M})
    fetcher = _fetcher(_Namesrv(_route(_group())), pool)
    with pytest.raises(ConnectionLostError):
        await fetcher._pull_once()
    assert fetcher.commit_addr() == S1   # the master failed: offsets go to the slave read from
    await fetcher._pull_once()
    assert pool.asked == [M, S1]
    pool.down.clear()
    fetcher.choice.master_down_until = 0.0   # time passed
    await fetcher._pull_once()
    assert pool.asked[-1] == M and fetcher.commit_addr() == M


async def test_fetcher_follows_suggest_slave_but_commits_to_the_live_master() -> None:
    pool = PullBroker({M: {"status": "OFFSET_OVERFLOW_ONE", "next_offset": 0, "suggest_slave": True},
                       S1: {"status": "OFFSET_OVERFLOW_ONE", "next_offset": 0}}, down=set())
    fetcher = _fetcher(_Namesrv(_route(_group())), pool)
    await fetcher._pull_once()
    assert fetcher.choice.choose(_group()) == S1 and fetcher.commit_addr() == M
    await fetcher._pull_once()   # the slave has nothing newer: back to the master
    await fetcher._pull_once()
    assert pool.asked == [M, S1, M]
