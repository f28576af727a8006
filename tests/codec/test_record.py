"""The record codec: round trips, fields by name, and corruption detection."""
from __future__ import annotations

import struct

import pytest
from ferry.codec import record
from ferry.codec.properties import decode_properties, encode_properties
from ferry.codec.record import (
    HEADER,
    HEADER_FIELDS,
    HEADER_SIZE,
    MessageIn,
    check_record,
    decode_record,
    encode_record,
    iter_records,
)
from ferry.codec.tags import tag_hash
from ferry.errors import CorruptRecordError
from hypothesis import given, settings
from hypothesis import strategies as st

_text = st.text(alphabet=st.characters(codec="utf-8"), max_size=40)
_prop_text = st.text(
    alphabet=st.characters(codec="utf-8", exclude_characters="\x01\x02"), max_size=30
)
_props = st.dictionaries(_prop_text.filter(bool), _prop_text, max_size=8)

_messages = st.builds(
    MessageIn,
    topic=st.from_regex(r"[A-Za-z0-9_-]{1,127}", fullmatch=True),
    queue_id=st.integers(0, 2**31 - 1),
    body=st.binary(max_size=3000),
    tags=_text,
    keys=_text,
    properties=_props.map(encode_properties),
    msg_id=st.binary(min_size=16, max_size=16),
    flags=st.integers(0, 2**32 - 1),
    born_ts_ms=st.integers(0, 2**62),
    born_host=st.text(alphabet="0123456789.:", max_size=21),
    reconsume_times=st.integers(0, 2**31 - 1),
    prepared_offset=st.integers(0, 2**62),
)


@given(_messages, st.integers(0, 2**62), st.integers(0, 2**62), st.integers(0, 2**62))
@settings(max_examples=200)
def test_record_round_trip(msg: MessageIn, qoff: int, phy: int, ts: int) -> None:
    raw = encode_record(msg, queue_offset=qoff, phy_offset=phy, store_ts_ms=ts,
                        store_host="10.1.2.3:10911")
    got = decode_record(raw)
    assert got.size == len(raw)
    assert (got.topic, got.queue_id, got.body, got.tags, got.keys, got.msg_id) == (
        msg.topic, msg.queue_id, msg.body, msg.tags, msg.keys, msg.msg_id)
    assert (got.flags, got.born_ts_ms, got.born_host, got.reconsume_times,
            got.prepared_offset) == (msg.flags, msg.born_ts_ms, msg.born_host,
                                     msg.reconsume_times, msg.prepared_offset)
    assert (got.queue_offset, got.phy_offset, got.store_ts_ms, got.store_host) == (
        qoff, phy, ts, "10.1.2.3:10911")
    assert got.tag_hash == tag_hash(msg.tags)
    assert got.properties_raw == msg.properties
    assert got.properties == decode_properties(msg.properties)
    # decodes the same from a memoryview at an offset (how PULL bodies are read)
    assert decode_record(memoryview(b"pad" + raw), 3) == got


@given(_messages.filter(lambda m: len(m.body) < 200), st.data())
@settings(max_examples=150)
def test_every_single_bit_flip_is_detected(msg: MessageIn, data: st.DataObject) -> None:
    raw = bytearray(encode_record(msg, queue_offset=7, phy_offset=0, store_ts_ms=1))
    bit = data.draw(st.integers(0, len(raw) * 8 - 1))
    raw[bit // 8] ^= 1 << (bit % 8)
    with pytest.raises(CorruptRecordError):
        decode_record(raw)


def test_truncated_records_are_detected() -> None:
    raw = encode_record(MessageIn("t", 0, b"hello"), queue_offset=0, phy_offset=0,
                        store_ts_ms=0)
    for cut in (0, 3, HEADER_SIZE - 1, HEADER_SIZE, len(raw) - 1):
        with pytest.raises(CorruptRecordError):
            decode_record(raw[:cut])


def test_iter_records_back_to_back() -> None:
    raws = [encode_record(MessageIn("t", 1, bytes([i]) * i, tags=f"t{i}"), queue_offset=i,
                          phy_offset=i * 1000, store_ts_ms=i) for i in range(20)]
    got = list(iter_records(b"".join(raws)))
    assert [m.queue_offset for m in got] == list(range(20))
    assert [m.body for m in got] == [bytes([i]) * i for i in range(20)]
    with pytest.raises(CorruptRecordError):
        list(iter_records(b"".join(raws)[:-1]))


def test_encode_rejects_bad_lengths() -> None:
    with pytest.raises(ValueError):
        encode_record(MessageIn("t", 0, b"", msg_id=b"short"), queue_offset=0, phy_offset=0,
                      store_ts_ms=0)
    with pytest.raises(ValueError):
        encode_record(MessageIn("t", 0, b"", tags="x" * 70_000), queue_offset=0, phy_offset=0,
                      store_ts_ms=0)


def test_field_constants_name_the_layout() -> None:
    """Every H_* index and AT_* offset is the position of the field it names."""
    offset = 0
    offsets = {}
    for name, code in record.HEADER_LAYOUT:
        offsets[name] = offset
        offset += struct.calcsize("<" + code)
    assert offset == HEADER_SIZE == 104
    for name in HEADER_FIELDS:
        const = "H_" + name.upper()
        if hasattr(record, const):
            assert getattr(record, const) == HEADER_FIELDS.index(name), const
        at = "AT_" + name.upper()
        if hasattr(record, at):
            assert getattr(record, at) == offsets[name], at
    assert record.CRC_START == offsets["flags"]
    assert record.SIZE_MAGIC.format == "<II" and record.SIZE_MAGIC_CRC.format == "<III"


def test_fields_read_by_name_from_an_encoded_record() -> None:
    msg = MessageIn("orders", 3, b"body", tags="t", keys="k1 k2", msg_id=bytes(range(16)),
                    flags=5, born_ts_ms=11, born_host="h:1", reconsume_times=2,
                    prepared_offset=99)
    raw = encode_record(msg, queue_offset=7, phy_offset=4096, store_ts_ms=12, store_host="s:2")
    h = HEADER.unpack_from(raw)
    assert (h[record.H_QUEUE_ID], h[record.H_QUEUE_OFFSET], h[record.H_PHY_OFFSET]) == (3, 7, 4096)
    assert (h[record.H_BORN_TS_MS], h[record.H_STORE_TS_MS], h[record.H_FLAGS]) == (11, 12, 5)
    assert (h[record.H_RECONSUME_TIMES], h[record.H_PREPARED_OFFSET]) == (2, 99)
    assert h[record.H_MSG_ID] == bytes(range(16)) and h[record.H_TAG_HASH] == tag_hash("t")
    assert record.I64.unpack_from(raw, record.AT_PHY_OFFSET)[0] == 4096
    assert record.I64.unpack_from(raw, record.AT_STORE_TS_MS)[0] == 12
    part_lengths = sum(h[HEADER_FIELDS.index(name)] for name in record.PART_LENGTH_FIELDS)
    assert part_lengths == len(raw) - HEADER_SIZE == check_record(raw) - HEADER_SIZE
