"""Reading a queue between two offsets (ferry.client.reading.ranges), without a broker."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ferry.client.core.message import TopicQueue
from ferry.client.reading import pull, read_range
from ferry.codec import MessageIn, encode_record
from ferry.wire import MAX_PULL_COUNT, PullRequest, PullStatus

TQ = TopicQueue("t", "broker-a", 0)


def _records(*offsets: int) -> bytes:
    return b"".join(encode_record(MessageIn("t", 0, f"m{o}".encode()), queue_offset=o,
                                  phy_offset=o * 100, store_ts_ms=1) for o in offsets)


class Pool:
    """Answers each PULL with the records from its offset up to `stored` (at most max_count)."""

    def __init__(self, stored: int, *, low: int = 0) -> None:
        self.stored, self.low = stored, low
        self.asked: list[tuple[str, dict[str, Any]]] = []

    async def request(self, addr: str, code: object, fields: Mapping[str, Any],
                      body: bytes = b"", timeout_ms: int | None = None) -> Any:
        self.asked.append((addr, dict(fields)))
        at, n = fields["offset"], fields["max_count"]
        if at < self.low:
            got: dict[str, Any] = {"status": "OFFSET_TOO_SMALL", "next_offset": self.low}
            data = b""
        elif at >= self.stored:
            got, data = {"status": "OFFSET_OVERFLOW_ONE", "next_offset": at}, b""
        else:
            end = min(self.stored, at + n + 2)   # a broker may answer past the asked range
            got, data = {"status": "FOUND", "next_offset": end}, _records(*range(at, end))
        return type("F", (), {"fields": got, "body": data})()


async def _locate(routes: object, tq: TopicQueue) -> str:
    return "addr-1"


async def _read(pool: Pool, start: int, end: int, batch: int = MAX_PULL_COUNT) -> list[int]:
    out = []
    async for records in read_range(pool, None, "g", TQ, start, end,   # type: ignore[arg-type]
                                    batch=batch, locate=_locate):
        out += [r.queue_offset for r in records]
    return out


async def test_a_range_is_read_exactly_in_batches() -> None:
    pool = Pool(stored=100)
    assert await _read(pool, 10, 25, batch=4) == list(range(10, 25))
    # The fake answers 2 records past what was asked: those past the range end are dropped.
    assert [(f["offset"], f["max_count"]) for _, f in pool.asked] == [(10, 4), (16, 4), (22, 3)]
    assert all(addr == "addr-1" and f["group"] == "g" and f["max_wait_ms"] == 0
               and "hist" not in f for addr, f in pool.asked)


async def test_a_queue_that_ends_early_stops_the_read() -> None:
    pool = Pool(stored=12)
    assert await _read(pool, 10, 25) == [10, 11]
    assert len(pool.asked) == 2


async def test_a_deleted_start_moves_forward_to_what_is_kept() -> None:
    assert await _read(Pool(stored=30, low=20), 10, 25) == list(range(20, 25))


async def test_an_empty_range_asks_nothing() -> None:
    pool = Pool(stored=10)
    assert await _read(pool, 5, 5) == [] and pool.asked == []


async def test_pull_parses_the_answer_of_its_request() -> None:
    answer = await pull(Pool(stored=3), "addr-1", PullRequest("g", "t", 0, 1, 8))  # type: ignore[arg-type]
    assert answer.status is PullStatus.FOUND and answer.next_offset == 3
    assert [r.queue_offset for r in answer.stored()] == [1, 2]
