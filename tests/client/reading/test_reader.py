"""The queue reader (ferry.client.reading.reader), without a broker: answers in, positions out."""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

import pytest
from ferry.client.core.namesrv import BrokerRoute, TopicRoute
from ferry.client.reading import (
    Cursor,
    QueueReader,
    ReadConfig,
    ReadQueue,
    route_or_none,
)
from ferry.codec import MessageIn, StoredMessage, encode_record
from ferry.errors import ConnectionLostError, TopicNotFoundError
from ferry.wire import PullAnswer

Q = ReadQueue("broker-a", "127.0.0.1:1", "t", 0)


def _records(*offsets: int) -> bytes:
    return b"".join(encode_record(MessageIn("t", 0, f"m{o}".encode()), queue_offset=o,
                                  phy_offset=o * 100, store_ts_ms=1) for o in offsets)


def answer(status: str, next_offset: int, body: bytes = b"", *, offset: int = 0,
           **more: Any) -> PullAnswer:
    return PullAnswer.parse({"status": status, "next_offset": next_offset, **more}, body, offset)


class Taker(QueueReader):
    """Takes every record (or only `limit` of each answer), remembers what it saw."""

    def __init__(self, limit: int | None = None, pool: Any = None, namesrv: Any = None) -> None:
        super().__init__(pool, namesrv, "t", ReadConfig("g", 32, 50, 20))
        self.taken: list[int] = []
        self.answers: list[str] = []
        self.limit = limit

    async def take(self, queue: ReadQueue, records: list[StoredMessage],
                   answer: PullAnswer) -> int:
        kept = records if self.limit is None else records[:self.limit]
        self.taken += [r.queue_offset for r in kept]
        return answer.next_offset if len(kept) == len(records) else records[len(kept)].queue_offset

    def answered(self, queue: ReadQueue, answer: PullAnswer, sent_ms: int) -> None:
        self.answers.append(answer.status.value)


async def test_found_records_go_to_the_handler_and_the_position_follows() -> None:
    r, cursor = Taker(), Cursor(5)
    await r.apply(Q, cursor, answer("FOUND", 7, _records(5, 6), offset=5, hist="H1"), 0)
    assert r.taken == [5, 6] and cursor.offset == 7 and cursor.hist == "H1"


async def test_a_handler_that_takes_less_keeps_the_rest_for_the_next_pull() -> None:
    r, cursor = Taker(limit=1), Cursor(5, "H0")
    await r.apply(Q, cursor, answer("FOUND", 8, _records(5, 6, 7), offset=5, hist="H1"), 0)
    # At 6, not at the answer's next_offset: H1 names the record at 7, so no history is kept.
    assert r.taken == [5] and cursor.offset == 6 and cursor.hist is None


@pytest.mark.parametrize("status", ["HISTORY_DIVERGED", "OFFSET_OVERFLOW_BADLY"])
async def test_an_answer_that_moves_back_is_followed_back_with_a_warning(
        status: str, caplog: pytest.LogCaptureFixture) -> None:
    r, cursor = Taker(), Cursor(10, "Hold")
    with caplog.at_level(logging.WARNING):
        await r.apply(Q, cursor, answer(status, 4, offset=10, hist="Hnew"), 0)
    assert cursor.offset == 4 and cursor.hist == "Hnew" and r.taken == []
    assert [m for m in caplog.messages if "offset 10" in m and status in m and "at 4" in m]


async def test_a_reseek_without_a_history_names_none() -> None:
    r, cursor = Taker(), Cursor(10, "Hold")
    await r.apply(Q, cursor, answer("OFFSET_TOO_SMALL", 20, offset=10), 0)
    assert cursor.offset == 20 and cursor.hist is None


async def test_skipped_records_move_the_position_forward_only() -> None:
    r, cursor = Taker(), Cursor(10, "H")
    await r.apply(Q, cursor, answer("NO_MATCHED_MESSAGE", 15, offset=10, hist="H"), 0)
    assert cursor.offset == 15 and cursor.hist == "H"
    await r.apply(Q, cursor, answer("NO_MESSAGE_IN_QUEUE", 3, offset=15), 0)
    assert cursor.offset == 15 and cursor.hist == "H"   # not moved: the history stays


async def test_an_answer_at_the_position_confirms_its_history() -> None:
    r, cursor = Taker(), Cursor(9)
    await r.apply(Q, cursor, answer("OFFSET_OVERFLOW_ONE", 9, offset=9, hist="H2"), 0)
    assert cursor.offset == 9 and cursor.hist == "H2"


async def test_the_handler_hears_every_answer_after_it_was_applied() -> None:
    r, cursor = Taker(), Cursor(0)
    await r.apply(Q, cursor, answer("FOUND", 1, _records(0)), 0)
    await r.apply(Q, cursor, answer("OFFSET_OVERFLOW_ONE", 1, offset=1), 0)
    assert r.answers == ["FOUND", "OFFSET_OVERFLOW_ONE"]


# -- the loop: route, tasks, PULLs ------------------------------------------------------------


class Namesrv:
    def __init__(self, route: TopicRoute | None) -> None:
        self.route = route

    async def get_route(self, topic: str) -> TopicRoute:
        if self.route is None:
            raise TopicNotFoundError(topic)
        return self.route


def _route(queues: int = 2, perm: str = "rw") -> TopicRoute:
    return TopicRoute("t", "normal", "rw", (BrokerRoute("broker-a", "", "127.0.0.1:1", queues,
                                                        perm),))


class Pool:
    """Answers PULLs from a script per queue; records what it was asked."""

    def __init__(self, answers: dict[int, list[tuple[dict[str, Any], bytes]]],
                 fail_first: int = 0) -> None:
        self.answers = answers
        self.asked: list[dict[str, Any]] = []
        self.fail_first = fail_first

    async def request(self, addr: str, code: object, fields: Mapping[str, Any],
                      body: bytes = b"", timeout_ms: int | None = None) -> Any:
        self.asked.append(dict(fields))
        if self.fail_first:
            self.fail_first -= 1
            raise ConnectionLostError("down")
        script = self.answers[fields["queue_id"]]
        if not script:
            await asyncio.sleep(3600)   # a long poll that never ends
        got, data = script.pop(0)
        return type("F", (), {"fields": got, "body": data})()


async def _until(cond: Any, timeout_s: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not cond():
        assert loop.time() < deadline, "timed out"
        await asyncio.sleep(0.01)


async def test_one_task_per_queue_reads_with_the_history_of_the_last_answer() -> None:
    pool = Pool({0: [({"status": "FOUND", "next_offset": 2, "hist": "H"}, _records(0, 1)),
                     ({"status": "FOUND", "next_offset": 3, "hist": "H"}, _records(2))],
                 1: []})
    r = Taker(pool=pool, namesrv=Namesrv(_route()))
    await r.reconcile()
    try:
        assert r.pulling == 2 and r.brokers == {"broker-a": "127.0.0.1:1"}
        await _until(lambda: r.taken == [0, 1, 2])
        q0 = [f for f in pool.asked if f["queue_id"] == 0]
        assert [(f["offset"], f.get("hist")) for f in q0[:3]] == [(0, None), (2, "H"), (3, "H")]
        assert q0[0]["group"] == "g" and q0[0]["max_count"] == 32
        assert q0[0]["max_wait_ms"] == 50
    finally:
        await r.stop()
    assert r.pulling == 0


async def test_a_failed_pull_is_tried_again_from_the_same_position(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("ferry.client.reading.reader.ERROR_BACKOFF_S", 0.01)
    pool = Pool({0: [({"status": "FOUND", "next_offset": 1}, _records(0))]}, fail_first=2)
    r = Taker(pool=pool, namesrv=Namesrv(_route(queues=1)))
    await r.reconcile()
    try:
        await _until(lambda: r.taken == [0])
        assert [f["offset"] for f in pool.asked[:3]] == [0, 0, 0]
    finally:
        await r.stop()


async def test_no_route_or_no_readable_queue_means_no_tasks() -> None:
    ns = Namesrv(_route(queues=1))
    r = Taker(pool=Pool({0: []}), namesrv=ns)
    await r.reconcile()
    assert r.pulling == 1
    ns.route = None
    await r.reconcile()
    assert r.pulling == 0 and r.brokers == {"broker-a": "127.0.0.1:1"}   # the last one known
    ns.route = _route(queues=1, perm="w")
    await r.reconcile()
    assert r.pulling == 0
    assert await route_or_none(Namesrv(None), "t") is None  # type: ignore[arg-type]


async def test_a_handler_that_is_not_ready_ends_its_task() -> None:
    class Once(Taker):
        go = True

        async def ready(self, queue: ReadQueue) -> bool:
            return self.go

        async def open(self, queue: ReadQueue) -> Cursor:
            return Cursor(40)

    pool = Pool({0: [({"status": "OFFSET_OVERFLOW_ONE", "next_offset": 40}, b"")] * 50})
    r = Once(pool=pool, namesrv=Namesrv(_route(queues=1)))
    await r.reconcile()
    await _until(lambda: len(pool.asked) >= 2)
    r.go = False
    await asyncio.sleep(0.05)
    asked = len(pool.asked)
    await asyncio.sleep(0.05)
    assert len(pool.asked) == asked and pool.asked[0]["offset"] == 40
    await r.stop()
