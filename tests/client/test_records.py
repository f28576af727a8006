"""Decoding PULL bodies into ConsumerRecords: every field as stored, checked, decoded once."""
from __future__ import annotations

import pickle

import pytest
from ferry.client.core.message import ConsumerRecord, TopicQueue
from ferry.client.core.records import decode_pull_body
from ferry.codec.properties import encode_properties
from ferry.codec.record import MessageIn, decode_record, encode_record, iter_records
from ferry.errors import CorruptRecordError


def _record(i: int, *, tags: str = "", keys: str = "", props: dict[str, str] | None = None,
            body: bytes = b"") -> bytes:
    msg = MessageIn("orders", 3, body or f"body-{i}".encode(), tags=tags, keys=keys,
                    properties=encode_properties(props or {}), born_ts_ms=1000 + i,
                    born_host="10.0.0.5:5123", reconsume_times=i % 3)
    return encode_record(msg, queue_offset=40 + i, phy_offset=4096 * i, store_ts_ms=2000 + i,
                         store_host="10.0.0.1:10911")


def test_every_field_matches_the_stored_record() -> None:
    body = b"".join([
        _record(0),
        _record(1, tags="created", keys="order-42 cust-7", props={"region": "eu", "n": "1"}),
        _record(2, tags="t\u00e9", keys="k\u00e9", props={"\u00e9": "\u00fc"}, body=b"x" * 5000),
    ])
    got = decode_pull_body(body, "orders", "broker-a")
    want = [ConsumerRecord.from_stored(m, "broker-a") for m in iter_records(body)]
    assert got == want
    for rec, stored in zip(got, iter_records(body), strict=True):
        assert rec.body == stored.body and type(rec.body) is bytes
        assert (rec.topic, rec.broker, rec.queue_id, rec.queue_offset) == \
            ("orders", "broker-a", 3, stored.queue_offset)
        assert rec.topic_queue == TopicQueue("orders", "broker-a", 3)
        assert rec.msg_id == stored.msg_id.hex().upper()
        assert (rec.born_ts_ms, rec.store_ts_ms, rec.reconsume_times) == \
            (stored.born_ts_ms, stored.store_ts_ms, stored.reconsume_times)
        assert rec.tags == (stored.tags or None)
        assert rec.keys == tuple(k for k in stored.keys.split(" ") if k)
        assert rec.key == (rec.keys[0] if rec.keys else None)
        assert dict(rec.properties) == stored.properties
    assert got[1].key == "order-42" and got[1].keys == ("order-42", "cust-7")
    assert got[1].properties == {"region": "eu", "n": "1"}
    assert got[2].tags == "t\u00e9" and got[2].properties == {"\u00e9": "\u00fc"}
    assert got[0].tags is None and got[0].key is None and got[0].properties == {}


def test_decoded_fields_are_cached_and_the_record_is_immutable() -> None:
    raw = _record(1, props={"a": "b"})
    rec = decode_pull_body(raw, "orders", "b")[0]
    assert rec.properties is rec.properties
    assert rec.msg_id is rec.msg_id
    with pytest.raises(AttributeError):
        rec.body = b"other"  # type: ignore[misc]
    with pytest.raises(AttributeError):
        rec.anything = 1  # type: ignore[attr-defined]
    again = decode_pull_body(raw, "orders", "b")[0]
    assert again == rec and hash(again) == hash(rec) and again != decode_pull_body(raw, "x", "b")[0]
    assert pickle.loads(pickle.dumps(rec)) == rec
    assert "queue_offset=41" in repr(rec)


def test_a_memoryview_body_gives_bytes_bodies() -> None:
    raw = _record(0) + _record(1)
    got = decode_pull_body(memoryview(raw), "orders", "b")
    assert [r.body for r in got] == [b"body-0", b"body-1"]
    assert all(type(r.body) is bytes for r in got)
    assert decode_pull_body(b"", "orders", "b") == []


@pytest.mark.parametrize("damage", ["crc", "truncated", "magic", "short_header", "lengths"])
def test_a_damaged_body_raises_corrupt_record(damage: str) -> None:
    good = _record(0, tags="t", props={"a": "b"})
    raw = bytearray(_record(1) + good)
    first = decode_record(raw).size
    if damage == "crc":
        raw[-1] ^= 0xFF
    elif damage == "truncated":
        del raw[-3:]
    elif damage == "magic":
        raw[first + 4] ^= 0xFF
    elif damage == "short_header":
        del raw[first + 50:]
    else:  # tags_len no longer adds up to the record size
        raw[first + 92] += 1
    with pytest.raises(CorruptRecordError):
        decode_pull_body(bytes(raw), "orders", "b")
