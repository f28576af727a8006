"""put_encoded_batch: the message batch input layout, checked against the wire's SEND body.

The store may not import ferry.wire, so it declares the layout itself
(`ferry.store.batch_input`); this test is where the two are held together.
"""
from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from ferry.errors import InvalidNameError, MalformedRequestError, MessageTooLargeError
from ferry.store import (
    BatchPutResult,
    GetStatus,
    MessageIn,
    MessageStore,
    PutStatus,
    StoreConfig,
    StoredMessage,
    decode_record,
    encode_properties,
    new_msg_id,
)
from ferry.store.batch_input import BATCH_ENTRY, BATCH_ENTRY_FIELDS
from ferry.wire import MESSAGE_HEAD, WireMessage, encode_messages
from ferry.wire.messages import MESSAGE_HEAD_FIELDS
from hypothesis import given, settings
from hypothesis import strategies as st

SMALL = dict(commitlog_segment_bytes=256 * 1024, max_message_bytes=16 * 1024,
             cq_entries_per_segment=50, index_max_slots=1024, index_max_entries=8192)
HOST = "10.1.2.3:4567"


def _config(root: Path | str) -> StoreConfig:
    return StoreConfig(root_dir=str(root), **SMALL)  # type: ignore[arg-type]


@pytest.fixture
def store(tmp_path: Path) -> Iterator[MessageStore]:
    s = MessageStore(_config(tmp_path))
    yield s
    s.close()


def _read(store: MessageStore, topic: str, qid: int) -> list[StoredMessage]:
    out: list[StoredMessage] = []
    offset = 0
    while True:
        got = store.get_messages(topic, qid, offset, max_count=64)
        if got.status is not GetStatus.FOUND:
            return out
        out += [decode_record(r) for r in got.records]
        offset = got.next_queue_offset


def _wire(i: int, size: int = 100, **kw: object) -> WireMessage:
    fields: dict[str, object] = dict(body=bytes([i % 256]) * size, msg_id=new_msg_id(),
                                     born_ts_ms=1_700_000_000_000 + i, flags=i % 3,
                                     tags=f"t{i % 4}", keys=f"order-{i} cust-{i % 7}",
                                     properties=encode_properties({"n": str(i)}))
    fields.update(kw)
    return WireMessage(**fields)  # type: ignore[arg-type]


def test_layout_equals_the_wire_send_body() -> None:
    assert BATCH_ENTRY.format == MESSAGE_HEAD.format
    assert BATCH_ENTRY.size == MESSAGE_HEAD.size == 44
    assert BATCH_ENTRY_FIELDS == MESSAGE_HEAD_FIELDS


def test_round_trip_of_an_encode_messages_body(store: MessageStore) -> None:
    store.put(MessageIn("orders", 2, b"before"))  # the batch continues the queue
    wire = [_wire(i, size=1000) for i in range(300)]  # ~330 KB: crosses a 256 KiB segment
    res = store.put_encoded_batch("orders", 2, encode_messages(wire), born_host=HOST)
    assert isinstance(res, BatchPutResult) and res.status is PutStatus.OK
    assert (res.message_count, res.first_queue_offset) == (300, 1)
    got = _read(store, "orders", 2)[1:]
    assert len(got) == 300
    assert got[0].phy_offset == res.first_phy_offset
    assert got[-1].end_offset == res.end_offset
    assert len({m.phy_offset // SMALL["commitlog_segment_bytes"] for m in got}) > 1
    for i, (w, m) in enumerate(zip(wire, got, strict=True)):
        assert (m.topic, m.queue_id, m.queue_offset) == ("orders", 2, 1 + i)
        assert (m.body, m.msg_id, m.born_ts_ms, m.flags) == (w.body, w.msg_id, w.born_ts_ms, w.flags)
        assert (m.tags, m.keys, m.properties_raw) == (w.tags, w.keys, w.properties)
        assert (m.born_host, m.store_host, m.store_ts_ms) == (HOST, "127.0.0.1:10911", res.store_ts_ms)
        assert m.properties == {"n": str(i)}
    assert store.max_offset("orders", 2) == 301
    assert store.query_by_id(wire[7].msg_id).body == wire[7].body  # type: ignore[union-attr]
    found = store.query_by_key("orders", "cust-3", 0, 2**62, max_count=100)
    assert sorted(m.keys for m in found) == sorted(w.keys for w in wire if w.keys.endswith("cust-3"))


def test_same_records_as_put_batch(tmp_path: Path) -> None:
    """The two inputs store byte-identical records (timestamps aside)."""
    wire = [_wire(i, size=i * 7) for i in range(20)]
    with MessageStore(_config(tmp_path / "a")) as a, MessageStore(_config(tmp_path / "b")) as b:
        a.put_encoded_batch("t", 0, encode_messages(wire), born_host=HOST)
        b.put_batch([MessageIn("t", 0, w.body, tags=w.tags, keys=w.keys, properties=w.properties,
                               msg_id=w.msg_id, flags=w.flags, born_ts_ms=w.born_ts_ms,
                               born_host=HOST) for w in wire])
        for x, y in zip(_read(a, "t", 0), _read(b, "t", 0), strict=True):
            assert x._replace(store_ts_ms=0) == y._replace(store_ts_ms=0)


def test_zero_msg_id_is_assigned(store: MessageStore) -> None:
    body = encode_messages([WireMessage(b"a", b"", 1), WireMessage(b"b", bytes(16), 2)])
    store.put_encoded_batch("ids", 0, memoryview(body))
    ids = [m.msg_id for m in _read(store, "ids", 0)]
    assert len(ids) == 2 and len(set(ids)) == 2 and bytes(16) not in ids
    assert store.query_by_id(ids[1]).body == b"b"  # type: ignore[union-attr]


def _bad(body: bytes, offset: int, value: bytes) -> bytes:
    return body[:offset] + value + body[offset + len(value):]


def test_bad_input_is_refused_and_nothing_is_written(store: MessageStore) -> None:
    good = encode_messages([_wire(1), _wire(2)])
    one = len(encode_messages([_wire(1)]))
    store.put_encoded_batch("bad", 0, good)
    big = encode_messages([_wire(1, size=16 * 1024 + 1)], max_body_bytes=1 << 20)
    props = encode_messages([_wire(1, properties=b"p" * 70_000)])
    cases: list[tuple[str, int, bytes, type[Exception], dict[str, object]]] = [
        ("bad", 0, good[:-1], MalformedRequestError, {}),  # truncated body
        ("bad", 0, good + good[:30], MalformedRequestError, {}),  # truncated entry head
        ("bad", 0, _bad(good, 0, (one + 1).to_bytes(4, "little")), MalformedRequestError, {}),
        ("bad", 0, _bad(good, one, (1 << 31).to_bytes(4, "little")), MalformedRequestError, {}),
        ("bad", 0, good + big, MessageTooLargeError, {}),
        ("bad", 0, good + props, MessageTooLargeError, {}),
        ("bad", 0, good + _bad(encode_messages([_wire(1, tags="xy")]), 44, b"\xff"),
         MalformedRequestError, {}),  # tags not UTF-8
        ("bad", 0, good + _bad(encode_messages([_wire(1, tags="", keys="k")]), 44, b"\xc3"),
         MalformedRequestError, {}),  # keys not UTF-8
        ("bad", 0, b"", MalformedRequestError, {}),
        ("bad", 0, good, MalformedRequestError, {"max_messages": 1}),
        ("bad", 70_000, good, MalformedRequestError, {}),
        ("bad", -1, good, MalformedRequestError, {}),
        ("bad topic", 0, good, InvalidNameError, {}),
        ("bad", 0, good, MalformedRequestError, {"born_host": "h" * 300}),
    ]
    for topic, qid, body, exc, kw in cases:
        with pytest.raises(exc):
            store.put_encoded_batch(topic, qid, body, **kw)  # type: ignore[arg-type]
    assert [m.body for m in _read(store, "bad", 0)] == [_wire(1).body, _wire(2).body]
    assert store.put_encoded_batch("bad", 0, good, max_messages=2).first_queue_offset == 2


@given(st.lists(st.tuples(st.binary(max_size=3000), st.text(max_size=8), st.text(max_size=20),
                          st.binary(max_size=50)), min_size=1, max_size=30))
@settings(max_examples=20, deadline=None)
def test_any_encodable_batch_reads_back(msgs: list[tuple[bytes, str, str, bytes]]) -> None:
    wire = [WireMessage(body, new_msg_id(), 5, 0, tags, keys, props)
            for body, tags, keys, props in msgs]
    with tempfile.TemporaryDirectory() as root, MessageStore(_config(root)) as s:
        s.put_encoded_batch("p", 1, encode_messages(wire))
        got = _read(s, "p", 1)
        assert [(m.body, m.tags, m.keys, m.properties_raw) for m in got] == [
            (w.body, w.tags, w.keys, w.properties) for w in wire]
