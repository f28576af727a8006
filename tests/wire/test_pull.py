"""The PULL answer parsed once (ferry.wire.pull): statuses, defaults, bad input, records."""
from __future__ import annotations

import pytest
from ferry.codec import MessageIn, encode_record
from ferry.errors import CorruptRecordError, MalformedRequestError
from ferry.store import GetStatus
from ferry.wire import MAX_PULL_COUNT, PullAnswer, PullRequest, PullStatus, response
from ferry.wire.codes import RequestCode
from ferry.wire.frame import Frame


def _record(queue_offset: int, body: bytes = b"x") -> bytes:
    return encode_record(MessageIn("t", 0, body), queue_offset=queue_offset,
                         phy_offset=queue_offset * 100, store_ts_ms=1)


def test_every_status_the_store_answers_is_a_pull_status() -> None:
    """The broker answers with the store's GetStatus names, plus HISTORY_DIVERGED and
    OFFSET_RESET (an operator reset the group's offset, issue 25)."""
    assert {s.name for s in GetStatus} | {"HISTORY_DIVERGED", "OFFSET_RESET"} == \
        {s.value for s in PullStatus}


def test_the_broker_handler_uses_the_limits_declared_here() -> None:
    from ferry_broker.handlers import pull as handler
    assert handler.MAX_PULL_COUNT == MAX_PULL_COUNT == 1024
    assert handler.HISTORY_DIVERGED == PullStatus.HISTORY_DIVERGED.value


def test_a_found_answer_is_parsed_with_its_records() -> None:
    body = _record(5, b"a") + _record(6, b"b")
    answer = PullAnswer.parse({"status": "FOUND", "next_offset": 7, "min_offset": 2,
                               "max_offset": 9, "hist": "H1", "suggest_slave": True}, body, 5)
    assert answer.status is PullStatus.FOUND and answer.found
    assert (answer.next_offset, answer.min_offset, answer.max_offset) == (7, 2, 9)
    assert answer.hist == "H1" and answer.suggest_slave
    assert [(r.queue_offset, bytes(r.body)) for r in answer.stored()] == [(5, b"a"), (6, b"b")]
    assert not answer.at_end   # 7 < 9: records remain


def test_missing_fields_default_to_the_asked_offset() -> None:
    answer = PullAnswer.parse({"status": "OFFSET_OVERFLOW_ONE"}, b"", 12)
    assert (answer.next_offset, answer.max_offset, answer.min_offset) == (12, 12, 0)
    assert answer.hist is None and not answer.suggest_slave and not answer.found
    assert answer.at_end


@pytest.mark.parametrize("fields", [{}, {"status": "NO_NEW_MSG"}, {"status": 3}])
def test_an_unknown_status_is_a_typed_error(fields: dict[str, object]) -> None:
    with pytest.raises(MalformedRequestError, match="unknown status"):
        PullAnswer.parse(fields, b"", 0)


def test_a_hist_that_is_not_a_string_names_no_history() -> None:
    answer = PullAnswer.parse({"status": "FOUND", "next_offset": 1, "hist": 7}, b"", 0)
    assert answer.hist is None
    assert PullAnswer.parse({"status": "FOUND", "suggest_slave": "yes"}, b"", 0).suggest_slave \
        is False


def test_a_corrupt_body_raises_when_its_records_are_read() -> None:
    body = bytearray(_record(0))
    body[-1] ^= 0xFF
    answer = PullAnswer.parse({"status": "FOUND", "next_offset": 1}, bytes(body), 0)
    with pytest.raises(CorruptRecordError):
        answer.stored()


@pytest.mark.parametrize(("status", "reseeks", "caught_up"), [
    (PullStatus.FOUND, False, False),
    (PullStatus.NO_MATCHED_MESSAGE, False, True),
    (PullStatus.NO_MESSAGE_IN_QUEUE, False, True),
    (PullStatus.OFFSET_OVERFLOW_ONE, False, True),
    (PullStatus.OFFSET_TOO_SMALL, True, False),
    (PullStatus.OFFSET_OVERFLOW_BADLY, True, False),
    (PullStatus.HISTORY_DIVERGED, True, False),
])
def test_which_statuses_move_the_position(status: PullStatus, reseeks: bool,
                                          caught_up: bool) -> None:
    assert status.reseeks is reseeks and status.caught_up is caught_up


def test_a_request_leaves_out_what_it_does_not_set() -> None:
    fields = PullRequest("g", "t", 3, 10, 32).fields()
    assert fields == {"group": "g", "topic": "t", "queue_id": 3, "offset": 10, "max_count": 32,
                      "max_wait_ms": 0, "tags": None, "sql": None}
    full = PullRequest("g", "t", 3, 10, 32, 500, max_bytes=1 << 20, hist="H",
                       tags="a||b").fields()
    assert full["hist"] == "H" and full["max_bytes"] == 1 << 20 and full["tags"] == "a||b"
    assert full["max_wait_ms"] == 500


def test_a_broker_response_frame_parses() -> None:
    req = Frame(RequestCode.PULL, 1, fields=PullRequest("g", "t", 0, 4, 8).fields())
    resp = response(req, {"status": "HISTORY_DIVERGED", "next_offset": 2, "min_offset": 0,
                          "max_offset": 3, "hist": "H0"})
    answer = PullAnswer.parse(resp.fields, resp.body, 4)
    assert answer.status is PullStatus.HISTORY_DIVERGED and answer.status.reseeks
    assert answer.next_offset == 2 and answer.hist == "H0"
