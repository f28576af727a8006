"""put_encoded_batch: the batch input (the wire's SEND body), and put_batch, which stages
its MessageIn tuples through the same loop.

The layout is declared once, in `ferry.codec.entry` (tests/codec/test_entry.py).
"""
from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from ferry.codec.message_flags import HOOKED_FLAGS, MessageFlag
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
from ferry.wire import WireMessage, encode_messages
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


def test_refused_flags_write_nothing(store: MessageStore) -> None:
    plain = encode_messages([_wire(0, flags=0), _wire(1, flags=0)])
    delayed = encode_messages([_wire(2, flags=int(MessageFlag.DELAY))])
    with pytest.raises(MalformedRequestError, match="carries flag"):
        store.put_encoded_batch("f", 0, plain + delayed, refuse_flags=HOOKED_FLAGS)
    assert _read(store, "f", 0) == []
    # Flags outside refuse_flags pass, and without refuse_flags every flag is stored as given.
    store.put_encoded_batch("f", 0, plain, refuse_flags=HOOKED_FLAGS)
    store.put_encoded_batch("f", 0, delayed)
    assert [m.flags for m in _read(store, "f", 0)] == [0, 0, int(MessageFlag.DELAY)]


def test_put_batch_runs_keep_per_message_fields(store: MessageStore) -> None:
    """Messages of several queues, born hosts, reconsume times and prepared offsets, in
    one put_batch: every record carries its own, queue offsets continue per queue."""
    store.put(MessageIn("a", 0, b"before"))
    msgs = [
        MessageIn("a", 0, b"0", born_host="h1", reconsume_times=1),
        MessageIn("a", 0, b"1", born_host="h1", reconsume_times=1),
        MessageIn("b", 1, b"2", born_host="h1", prepared_offset=77),
        MessageIn("a", 0, b"3", born_host="h2", tags="x", keys="k"),
        MessageIn("a", 0, b"4", born_host="h2", reconsume_times=3, msg_id=new_msg_id()),
        MessageIn("b", 1, b"5"),
    ]
    results = store.put_batch(msgs)
    assert [r.queue_offset for r in results] == [1, 2, 0, 3, 4, 1]
    assert all(r.store_ts_ms == results[0].store_ts_ms for r in results)
    assert results[4].msg_id == msgs[4].msg_id
    assert [r.phy_offset + r.size for r in results[:-1]] == [r.phy_offset for r in results[1:]]
    stored = {m.body: m for m in _read(store, "a", 0) + _read(store, "b", 1)}
    for msg, res in zip(msgs, results, strict=True):
        got = stored[msg.body]
        assert (got.topic, got.queue_id, got.born_host, got.reconsume_times,
                got.prepared_offset, got.tags, got.keys) == (
            msg.topic, msg.queue_id, msg.born_host, msg.reconsume_times,
            msg.prepared_offset, msg.tags, msg.keys)
        assert (got.msg_id, got.phy_offset, got.size, got.queue_offset) == (
            res.msg_id, res.phy_offset, res.size, res.queue_offset)
        assert store.query_by_id(res.msg_id).body == msg.body  # type: ignore[union-attr]
    assert store.query_by_key("a", "k", 0, 2**62)[0].body == b"3"


def test_a_bad_message_in_a_later_run_writes_nothing(store: MessageStore) -> None:
    good = [MessageIn("a", 0, b"0"), MessageIn("b", 0, b"1", born_host="h")]
    for bad in (MessageIn("a", 0, b"", reconsume_times=1 << 40),
                MessageIn("a", 0, b"", prepared_offset=1 << 64),
                MessageIn("a", 2000, b""), MessageIn("a", True, b"")):  # type: ignore[arg-type]
        with pytest.raises(MalformedRequestError):
            store.put_batch([*good, bad])
    assert _read(store, "a", 0) == [] and _read(store, "b", 0) == []
    assert [r.queue_offset for r in store.put_batch(good)] == [0, 0]
