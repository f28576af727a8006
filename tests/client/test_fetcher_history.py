"""The fetcher's side of replaced histories (issue 16): it sends `hist`, goes back on
HISTORY_DIVERGED, drops what it buffered past that offset and hands it out again."""
from __future__ import annotations

import asyncio
from typing import Any, NamedTuple

from ferry.client.consuming.consumer import Consumer
from ferry.client.consuming.fetcher import FetchConfig, QueueFetcher
from ferry.client.core.message import ConsumerRecord, TopicQueue
from ferry.client.core.namesrv import BrokerRoute, TopicRoute

TQ = TopicQueue("t", "broker-a", 0)
ROUTE = TopicRoute("t", "normal", "rw", (BrokerRoute("broker-a", "c", "127.0.0.1:1", 4),))


def _records(start: int, stop: int) -> list[ConsumerRecord]:
    return [tuple.__new__(ConsumerRecord, (b"x", "t", 0, o, 0, 0, 0, "broker-a", None, b""))
            for o in range(start, stop)]


class FakeFrame(NamedTuple):
    fields: dict[str, Any]
    body: bytes = b""


class Broker:
    """Answers PULLs from a script and keeps the fields of each."""

    def __init__(self, *answers: dict[str, Any]) -> None:
        self.answers = list(answers)
        self.asked: list[dict[str, Any]] = []

    async def request(self, addr: str, code: int, fields: dict[str, Any],
                      **kw: Any) -> FakeFrame:
        self.asked.append(dict(fields))
        return FakeFrame(self.answers.pop(0))


class Routes:
    def cached(self, topic: str) -> TopicRoute:
        return ROUTE

    async def route(self, topic: str) -> TopicRoute:
        return ROUTE

    def invalidate(self, topic: str) -> None:
        pass


def _fetcher(pool: Any = None, **kw: Any) -> tuple[QueueFetcher, list[tuple[TopicQueue, int]]]:
    rewound: list[tuple[TopicQueue, int]] = []
    f = QueueFetcher(tq=TQ, pool=pool, routes=Routes(), config=FetchConfig(group="g"),  # type: ignore[arg-type]
                     wakeup=asyncio.Event(), fetch_offset=0,
                     on_rewind=lambda tq, o: rewound.append((tq, o)), **kw)
    return f, rewound


async def test_rewind_drops_records_past_the_divergence_and_hands_them_out_again() -> None:
    f, rewound = _fetcher()
    f._mark("La")
    f._push(_records(0, 10), 10)
    f.fetch_offset = 10
    assert [r.queue_offset for r in f.take(4)] == [0, 1, 2, 3] and f.delivered == 4
    f._push(_records(10, 20), 20)
    f.fetch_offset = 20
    f._rewind(6, "La", "HISTORY_DIVERGED")
    assert f.fetch_offset == 6 and f.buffered == 2 and rewound == [(TQ, 6)]
    assert [r.queue_offset for r in f.take(10)] == [4, 5] and f.delivered == 6
    # Back below what was handed out: delivered (and the consumer's position) go back too.
    f._rewind(2, None, "HISTORY_DIVERGED")
    assert f.delivered == 2 and f.buffered == 0 and f.hist is None
    assert f.config.history_events == 2


async def test_pull_sends_hist_and_follows_the_divergence_answer() -> None:
    broker = Broker(
        {"status": "HISTORY_DIVERGED", "next_offset": 1200, "min_offset": 0,
         "max_offset": 1350, "hist": "E4"},
        {"status": "NO_MATCHED_MESSAGE", "next_offset": 1300, "min_offset": 0,
         "max_offset": 1350, "hist": "E5"})
    f, rewound = _fetcher(broker, hist="L9f3c0a12b4d5e6f7")
    f.fetch_offset = f.delivered = 1500
    assert not await f._pull_once()
    assert broker.asked[0]["hist"] == "L9f3c0a12b4d5e6f7" and broker.asked[0]["offset"] == 1500
    assert f.fetch_offset == 1200 and f.delivered == 1200 and rewound == [(TQ, 1200)]
    await f._pull_once()
    assert broker.asked[1]["hist"] == "E4" and broker.asked[1]["offset"] == 1200
    assert f.hist == "E5" and f.fetch_offset == 1300
    # What a commit names: the history of the record before the committed offset.
    assert f.hist_at(1199) == "E4" and f.hist_at(1299) == "E5"


async def test_a_seek_forgets_the_history() -> None:
    f, _ = _fetcher(hist="E4")
    await f.seek(10)
    await f.stop()   # before its pull loop ran
    assert f.hist is None and f.hist_at(9) is None


async def test_an_internal_rewind_keeps_the_history_of_the_record_before() -> None:
    # A consumer re-handing records out (run() cancelled, a lock regained) rewinds with
    # the history kept: a log replaced meanwhile still sends the next PULL back.
    broker = Broker({"status": "HISTORY_DIVERGED", "next_offset": 0, "min_offset": 0,
                     "max_offset": 2000})
    f, rewound = _fetcher(broker, hist="La")
    f._mark("La")
    f._push(_records(0, 600), 600)
    f.fetch_offset = 600
    f._mark("Lb")
    f._push(_records(600, 1000), 1000)
    f.fetch_offset = 1000
    f.take(1000)
    await f.seek(950, keep_hist=True)
    await f.stop()
    assert f.hist == "Lb" and f.hist_at(599) == "La" and f.hist_at(949) == "Lb"
    await f._pull_once()
    assert broker.asked[0]["hist"] == "Lb" and broker.asked[0]["offset"] == 950
    assert f.fetch_offset == 0 and rewound == [(TQ, 0)]


async def test_an_internal_rewind_below_a_history_change_names_the_older_one() -> None:
    f, _ = _fetcher(hist="La")
    f._push(_records(0, 600), 600)
    f.fetch_offset = 600
    f._mark("Lb")
    f._push(_records(600, 1000), 1000)
    f.fetch_offset = 1000
    f.take(1000)
    await f.seek(300, keep_hist=True)
    await f.stop()
    assert f.hist == "La" and f.hist_at(299) == "La" and f.hist_at(700) == "La"
    # A user's seek forgets it all.
    await f.seek(200)
    await f.stop()
    assert f.hist is None and f.hist_at(100) is None


async def test_consumer_rewind_keeps_the_history() -> None:
    consumer = Consumer("t", group="g", namesrv="http://127.0.0.1:1")
    f, _ = _fetcher(hist="E3")
    f._push(_records(0, 10), 10)
    f.fetch_offset = 10
    f.take(10)
    consumer._fetchers[TQ] = f
    consumer._assignment.started = True
    await consumer.rewind(TQ, 4)
    await f.stop()
    assert f.delivered == 4 and f.hist == "E3"
