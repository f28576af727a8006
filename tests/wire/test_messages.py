"""The SEND message batch: round trips and every way a batch can be wrong."""
from __future__ import annotations

import pytest
from ferry.codec.entry import ENTRY_HEAD
from ferry.errors import MalformedRequestError, MessageTooLargeError
from ferry.wire import MAX_BODY_BYTES, WireMessage, decode_messages, encode_messages
from hypothesis import given
from hypothesis import strategies as st

from tests.wire.strategies import wire_messages

MSG_ID = bytes(range(1, 17))


def _msg(**kw: object) -> WireMessage:
    base: dict[str, object] = {"body": b"hello", "msg_id": MSG_ID, "born_ts_ms": 1_700_000_000_000}
    base.update(kw)
    return WireMessage(**base)  # type: ignore[arg-type]


@given(st.lists(wire_messages, max_size=10))
def test_round_trip(msgs: list[WireMessage]) -> None:
    assert decode_messages(encode_messages(msgs)) == msgs


@given(st.lists(wire_messages, min_size=1, max_size=5))
def test_memoryview_input(msgs: list[WireMessage]) -> None:
    raw = encode_messages(msgs)
    assert decode_messages(memoryview(raw)) == msgs
    assert decode_messages(bytearray(raw)) == msgs


def test_layout_is_the_documented_one() -> None:
    raw = encode_messages([_msg(tags="TagA", keys="k1 k2", properties=b"a\x01b\x02", flags=7)])
    assert ENTRY_HEAD.size == 44
    length, msg_id, born, flags, tl, kl, pl, bl = ENTRY_HEAD.unpack_from(raw)
    assert (length, msg_id, born, flags, tl, kl, pl, bl) == (
        len(raw), MSG_ID, 1_700_000_000_000, 7, 4, 5, 4, 5)
    assert raw[44:] == b"TagAk1 k2a\x01b\x02hello"


def test_empty_msg_id_travels_as_zeros() -> None:
    raw = encode_messages([_msg(msg_id=b"")])
    assert raw[4:20] == bytes(16)
    assert decode_messages(raw)[0].msg_id == b""


def test_empty_batch() -> None:
    assert encode_messages([]) == b""
    assert decode_messages(b"") == []


def test_body_over_the_limit() -> None:
    big = _msg(body=bytes(5 * 1024 * 1024))
    with pytest.raises(MessageTooLargeError):
        encode_messages([big])
    raw = encode_messages([big], max_body_bytes=8 * 1024 * 1024)
    with pytest.raises(MessageTooLargeError):
        decode_messages(raw)
    assert decode_messages(raw, max_body_bytes=8 * 1024 * 1024) == [big]
    assert len(decode_messages(encode_messages([_msg(body=bytes(MAX_BODY_BYTES))]))) == 1


def test_announced_body_over_the_limit_without_the_bytes() -> None:
    head = ENTRY_HEAD.pack(44 + 5 * 1024 * 1024, MSG_ID, 0, 0, 0, 0, 0, 5 * 1024 * 1024)
    with pytest.raises(MessageTooLargeError):
        decode_messages(head)


@pytest.mark.parametrize("cut", [1, 10, 43, 44, 45, 49])
def test_truncated_batch(cut: int) -> None:
    raw = encode_messages([_msg(tags="t"), _msg(keys="k")])
    with pytest.raises(MalformedRequestError, match="truncated"):
        decode_messages(raw[:-cut])


def test_length_disagreeing_with_fields() -> None:
    raw = bytearray(encode_messages([_msg()]))
    raw[0] += 1
    with pytest.raises(MalformedRequestError, match="disagrees"):
        decode_messages(bytes(raw) + b"x")


def test_tags_not_utf8() -> None:
    raw = bytearray(encode_messages([_msg(tags="ab")]))
    raw[44] = 0xFF
    with pytest.raises(MalformedRequestError, match="UTF-8"):
        decode_messages(raw)


@given(st.binary(max_size=300))
def test_garbage_raises_a_typed_error(data: bytes) -> None:
    try:
        for m in decode_messages(data):
            assert isinstance(m, WireMessage)
    except (MalformedRequestError, MessageTooLargeError):
        pass


@pytest.mark.parametrize("bad", [
    {"msg_id": b"short"},
    {"tags": "x" * 70000},
    {"flags": -1},
    {"flags": 2**32},
    {"born_ts_ms": 2**63},
])
def test_encode_refuses_fields_that_do_not_fit(bad: dict[str, object]) -> None:
    with pytest.raises(MalformedRequestError):
        encode_messages([_msg(**bad)])
