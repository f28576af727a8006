"""What one PULL answer does to the scan (ferry_txn_checker.scan), without a broker."""
from __future__ import annotations

import logging

import pytest
from ferry.client.reading import ReadQueue
from ferry.names import HALF_TOPIC, OP_TOPIC
from ferry.wire import PullAnswer
from ferry_txn_checker.config import CheckerConfig
from ferry_txn_checker.scan import QUEUE_ID, Scanner
from ferry_txn_checker.state import Book

from tests.txn_checker.records import half, op, raw

T0 = 1_700_000_000_000


def scanner(max_open: int = 100) -> Scanner:
    cfg = CheckerConfig(max_open=max_open)
    book = Book(default_immunity_ms=0, max_open=max_open, max_discarded=10, max_recent=10)
    return Scanner(cfg, None, None, book)  # type: ignore[arg-type]


async def take(s: Scanner, broker: str, half: bool, offset: int, sent_ms: int,
               fields: dict[str, object], body: bytes) -> None:
    """What the scan does with one PULL answer (sent from `offset` at `sent_ms`)."""
    topic = HALF_TOPIC if half else OP_TOPIC
    await s.apply(ReadQueue(broker, "addr", topic, QUEUE_ID), s.cursor(broker, topic),
                         PullAnswer.parse(fields, body, offset), sent_ms)


async def test_the_op_scan_is_synced_only_when_it_reached_the_end_of_the_queue() -> None:
    s = scanner()
    h = half(0, T0)
    await take(s, "a", True, 0, T0, {"status": "FOUND", "next_offset": 1, "max_offset": 1},
               raw(h))
    rec = op(0, h)
    await take(s, "a", False, 0, T0 + 5,
               {"status": "FOUND", "next_offset": 1, "max_offset": 9}, raw(rec))
    scan = s.book.broker("a")
    assert scan.op_next == 1 and scan.op_synced_ms == 0  # ops 1..8 not read yet
    await take(s, "a", False, 1, T0 + 7,
               {"status": "NO_MESSAGE_IN_QUEUE", "next_offset": 1, "max_offset": 1}, b"")
    assert scan.op_synced_ms == T0 + 7
    assert s.book.open_count == 0


@pytest.mark.parametrize("half_queue", [True, False])
async def test_a_position_the_broker_no_longer_has_is_moved_to_its_answer(
        half_queue: bool) -> None:
    s = scanner()
    await take(s, "a", half_queue, 50, T0,
               {"status": "OFFSET_OVERFLOW_BADLY", "next_offset": 7, "max_offset": 7}, b"")
    scan = s.book.broker("a")
    assert (scan.half_next if half_queue else scan.op_next) == 7


def test_the_half_scan_pauses_with_a_warning_at_max_open(
        caplog: pytest.LogCaptureFixture) -> None:
    s = scanner(max_open=1)
    assert not s._paused("a")
    s.book.add_halves("a", [half(0, T0)], 1)
    with caplog.at_level(logging.WARNING):
        assert s._paused("a") and s._paused("a")
    assert [r.getMessage() for r in caplog.records if "max_open" in r.getMessage()] != []
    assert len(caplog.records) == 1  # once a minute, not once a pull

