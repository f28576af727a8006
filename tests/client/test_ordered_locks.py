"""QueueLocks: when a queue lock counts as valid and owned, on a clock the test drives.

The broker is a small scripted stand-in here (what it answers is what the
test says), so that the timing rules are checked exactly: a lock asked for at
time t is valid until t + expiry/2 and owned until t + expiry, whenever the
answer arrives. The real LOCK/UNLOCK round trips are in test_ordered.py.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
from ferry.client import TopicQueue
from ferry.client.consuming.queue_locks import MAX_LOCK_QUEUES, QueueLocks
from ferry.errors import ConnectionLostError
from ferry.wire import RequestCode

EXPIRY_MS = 60_000


@dataclass
class Clock:
    now: float = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Routes:
    """Every broker `b` is at address `addr-b`."""

    def cached(self, topic: str) -> Any:
        return None

    def invalidate(self, topic: str) -> None:
        return None

    async def route(self, topic: str) -> Any:
        return SimpleNamespace(broker_addr=lambda name: f"addr-{name}")


@dataclass
class Broker:
    """Answers LOCK with the asked queues minus `held_by_others`, after `delay_s` of clock."""

    clock: Clock
    held_by_others: set[int] = field(default_factory=set)
    delay_s: float = 0.0
    fail: bool = False
    requests: list[tuple[str, int, dict[str, Any]]] = field(default_factory=list)

    async def request(self, addr: str, code: int, fields: dict[str, Any], body: bytes = b"",
                      *, timeout_ms: int | None = None) -> Any:
        self.requests.append((addr, code, fields))
        self.clock.now += self.delay_s
        if self.fail:
            raise ConnectionLostError("broker gone")
        if code == RequestCode.LOCK:
            locked = [q for q in fields["queue_ids"] if q not in self.held_by_others]
            return SimpleNamespace(fields={"locked": locked, "expiry_ms": EXPIRY_MS})
        return SimpleNamespace(fields={})


def make(clock: Clock, broker: Broker) -> QueueLocks:
    return QueueLocks(broker, Routes(), group="g", client_id="me", clock=clock)  # type: ignore[arg-type]


def tq(q: int, topic: str = "t", broker: str = "a") -> TopicQueue:
    return TopicQueue(topic, broker, q)


async def test_a_lock_is_valid_for_half_the_expiry_and_owned_for_all_of_it() -> None:
    clock = Clock()
    locks = make(clock, Broker(clock))
    assert await locks.lock([tq(0), tq(1)]) == {tq(0), tq(1)}
    clock.now += EXPIRY_MS / 2000 - 0.001
    assert locks.valid(tq(0)) and locks.owned(tq(0))
    clock.now += 0.001
    assert not locks.valid(tq(0))        # messages stop here...
    assert locks.owned(tq(0))            # ...but no other member can have it yet
    clock.now += EXPIRY_MS / 2000
    assert not locks.owned(tq(0)) and locks.held() == set()


async def test_validity_counts_from_when_the_request_was_sent_not_answered() -> None:
    clock = Clock()
    broker = Broker(clock, delay_s=5.0)   # the answer takes 5 s
    locks = make(clock, broker)
    sent = clock.now
    await locks.lock([tq(0)])
    assert locks.valid_until(tq(0)) == sent + EXPIRY_MS / 2000


async def test_one_request_per_broker_and_topic_and_queues_of_others_are_not_valid() -> None:
    clock = Clock()
    broker = Broker(clock, held_by_others={2})
    locks = make(clock, broker)
    wanted = [tq(0), tq(2), tq(1, broker="b"), tq(3, topic="u")]
    assert await locks.lock(wanted) == {tq(0), tq(1, broker="b"), tq(3, topic="u")}
    asked = sorted((addr, f["topic"], f["queue_ids"]) for addr, code, f in broker.requests)
    assert asked == [("addr-a", "t", [0, 2]), ("addr-a", "u", [3]), ("addr-b", "t", [1])]
    assert all(code == RequestCode.LOCK and f["group"] == "g" and f["client_id"] == "me"
               for _, code, f in broker.requests)
    assert not locks.valid(tq(2)) and not locks.owned(tq(2))


async def test_a_renewal_that_leaves_a_queue_out_drops_it_and_one_that_fails_keeps_it() -> None:
    clock = Clock()
    broker = Broker(clock)
    locks = make(clock, broker)
    await locks.lock([tq(0), tq(1)])
    clock.now += 10
    broker.fail = True                    # the broker is away: the old grants stand, then lapse
    assert await locks.lock([tq(0), tq(1)]) == {tq(0), tq(1)}
    clock.now += EXPIRY_MS / 2000 - 10
    assert not locks.valid(tq(0))
    broker.fail, broker.held_by_others = False, {1}   # back; another member took queue 1
    assert await locks.lock([tq(0), tq(1)]) == {tq(0)}
    assert locks.valid(tq(0)) and not locks.owned(tq(1))


async def test_unlock_forgets_at_once_and_tells_the_broker() -> None:
    clock = Clock()
    broker = Broker(clock)
    locks = make(clock, broker)
    await locks.lock([tq(0), tq(1)])
    await locks.unlock([tq(1)])
    assert locks.valid(tq(0)) and not locks.valid(tq(1)) and not locks.owned(tq(1))
    addr, code, fields = broker.requests[-1]
    assert (addr, code, fields["queue_ids"]) == ("addr-a", RequestCode.UNLOCK, [1])


async def test_many_queues_are_split_into_requests_of_at_most_the_protocol_limit() -> None:
    clock = Clock()
    broker = Broker(clock)
    locks = make(clock, broker)
    wanted = [tq(q) for q in range(MAX_LOCK_QUEUES + 5)]
    assert await locks.lock(wanted) == set(wanted)
    assert sorted(len(f["queue_ids"]) for _, _, f in broker.requests) == [5, MAX_LOCK_QUEUES]


def test_protocol_limit_matches_the_doc() -> None:
    assert MAX_LOCK_QUEUES == 1024   # docs/protocol.md, 32 LOCK: "at most 1024"


@pytest.mark.parametrize("bad", [{"suspend_ms": -1}, {"lock_renew_interval_ms": 0}])
def test_bad_ordered_options_are_refused(bad: dict[str, int]) -> None:
    from ferry.client import Consumer
    with pytest.raises(ValueError):
        Consumer("t", group="g", namesrv="127.0.0.1:1", **bad)
