"""The check step against a fake broker: what each answer does to the book.

The only fake in this package: a pool answering CHECK_TRANSACTION and
END_TRANSACTION as a broker would, recording what was sent. The real broker
is in test_integration.py.
"""
from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from ferry.client.reading import now_ms
from ferry.errors import (
    ConnectionLostError,
    MalformedRequestError,
    MessageNotFoundError,
    TransactionStateError,
)
from ferry.wire import RequestCode
from ferry_txn_checker.checker import Checker
from ferry_txn_checker.config import CheckerConfig
from ferry_txn_checker.scans import OpenTxn
from ferry_txn_checker.state import Book

from tests.txn_checker.records import half

T0 = 1_700_000_000_000


class FakeBroker:
    """Answers requests from a script: a dict of fields, or an exception to raise."""

    def __init__(self, *answers: dict[str, Any] | Exception) -> None:
        self.answers = list(answers)
        self.sent: list[tuple[int, dict[str, Any]]] = []

    async def request(self, addr: str, code: int, fields: dict[str, Any], **_: Any
                      ) -> SimpleNamespace:
        self.sent.append((code, fields))
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return SimpleNamespace(fields=answer, body=b"")


def setup(broker: FakeBroker, checks: int = 0, max_checks: int = 3
          ) -> tuple[Checker, Book, OpenTxn]:
    cfg = CheckerConfig(max_checks=max_checks, check_interval_ms=1000, retry_backoff_ms=500)
    book = Book(default_immunity_ms=0, max_open=10, max_discarded=10, max_recent=10)
    book.add_halves("a", [half(0, T0, group="g")], 1)
    book.broker("a").op_synced_ms = T0 + 10**9
    (txn,) = book.take_due(T0 + 10**9, 1, 100)
    txn.checks = checks
    checker = Checker(cfg, book, broker, lambda: {"a": "127.0.0.1:1"})  # type: ignore[arg-type]
    return checker, book, txn


async def test_a_forwarded_check_counts_and_waits_an_interval() -> None:
    broker = FakeBroker({"forwarded": True, "state": "open"})
    checker, book, txn = setup(broker)
    await checker._step(txn)
    assert broker.sent[0][0] == RequestCode.CHECK_TRANSACTION
    assert broker.sent[0][1]["msg_id"] == bytes.fromhex(txn.msg_id)
    assert txn.checks == 1 and not txn.in_flight and book.counters["checked"] == 1


async def test_an_ended_transaction_is_dropped_without_a_check() -> None:
    broker = FakeBroker({"forwarded": False, "state": "committed"})
    checker, book, txn = setup(broker)
    await checker._step(txn)
    assert book.open_count == 0 and txn.checks == 0
    assert book.counters["ended_before_check"] == 1


async def test_after_max_checks_it_rolls_back_as_discarded() -> None:
    broker = FakeBroker({"state": "rolled_back", "queue_offset": -1})
    checker, book, txn = setup(broker, checks=3)
    await checker._step(txn)
    code, fields = broker.sent[0]
    assert code == RequestCode.END_TRANSACTION
    assert (fields["action"], fields["by"], fields["from_check"]) == ("rollback", "discarded",
                                                                      True)
    assert book.open_count == 0 and book.list_discarded(5)[0]["msg_id"] == txn.msg_id


async def test_a_discard_of_a_committed_transaction_leaves_it_committed() -> None:
    broker = FakeBroker(TransactionStateError("already committed"))
    checker, book, txn = setup(broker, checks=3)
    await checker._step(txn)
    assert book.open_count == 0 and not book.discarded
    assert book.find(txn.msg_id)["state"] == "committed"


@pytest.mark.parametrize("error", [ConnectionLostError("gone"), OSError("refused")])
async def test_an_unreachable_broker_is_asked_again_without_counting(error: Exception) -> None:
    broker = FakeBroker(error)
    checker, book, txn = setup(broker)
    await checker._step(txn)
    assert txn.checks == 0 and book.open_count == 1 and not txn.in_flight
    assert 0 < txn.heap_key - now_ms() <= 500 and book.counters["check_errors"] == 1


async def test_a_lasting_refusal_is_asked_again_only_every_interval() -> None:
    checker, book, txn = setup(FakeBroker(MalformedRequestError("another group")))
    await checker._step(txn)
    assert txn.checks == 0 and book.open_count == 1
    assert txn.heap_key - now_ms() > 600  # check_interval_ms (1000), not the 500 back-off


async def test_a_half_the_broker_lost_is_dropped() -> None:
    checker, book, txn = setup(FakeBroker(MessageNotFoundError("no transaction")))
    await checker._step(txn)
    assert book.open_count == 0 and book.counters["halves_lost"] == 1


@pytest.mark.parametrize("checks", [0, 3])  # a check, and the discard (max_checks 3)
async def test_a_node_that_no_longer_leads_sends_nothing(checks: int) -> None:
    broker = FakeBroker()
    checker, book, txn = setup(broker, checks=checks)
    leading = [False]
    checker.may_act = lambda: leading[0]
    await checker._step(txn)
    assert broker.sent == [] and txn.checks == checks and book.open_count == 1
    assert not txn.in_flight and book.counters["check_errors"] == 0  # put back, not failed
