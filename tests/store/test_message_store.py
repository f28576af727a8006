"""MessageStore: the facade's behaviour as the broker relies on it."""
from __future__ import annotations

import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from ferry.codec.record import check_records
from ferry.errors import (
    CorruptRecordError,
    InvalidNameError,
    MalformedRequestError,
    MessageTooLargeError,
    StoreError,
)
from ferry.store import (
    FlushMode,
    GetStatus,
    MessageIn,
    MessageStore,
    StoreConfig,
    decode_record,
    encode_properties,
    iter_records,
    new_msg_id,
    tag_hash,
)
from hypothesis import given, settings
from hypothesis import strategies as st

SMALL = dict(commitlog_segment_bytes=256 * 1024, max_message_bytes=16 * 1024,
             cq_entries_per_segment=50, index_max_slots=1024, index_max_entries=4096)


def _config(root: Path | str, **kw: object) -> StoreConfig:
    return StoreConfig(root_dir=str(root), **{**SMALL, **kw})  # type: ignore[arg-type]


@pytest.fixture
def store(tmp_path: Path) -> Iterator[MessageStore]:
    s = MessageStore(_config(tmp_path))
    yield s
    s.close()


def _bodies(store: MessageStore, topic: str, qid: int, start: int = 0) -> list[bytes]:
    out: list[bytes] = []
    offset = start
    while True:
        got = store.get_messages(topic, qid, offset, max_count=100)
        if got.status is not GetStatus.FOUND:
            return out
        out += [decode_record(r).body for r in got.records]
        offset = got.next_queue_offset


_batches = st.lists(st.lists(st.tuples(st.sampled_from(["a", "b-2", "%RETRY%g"]),
                                       st.integers(0, 3), st.binary(max_size=5000)),
                             min_size=1, max_size=20), min_size=1, max_size=8)


@given(_batches)
@settings(max_examples=25, deadline=None)
def test_interleaved_topics_and_queues_match_a_model(batches: list) -> None:
    with tempfile.TemporaryDirectory() as root:
        model: dict[tuple[str, int], list[bytes]] = {}
        with MessageStore(_config(root)) as s:
            for batch in batches:
                res = s.put_batch([MessageIn(t, q, b) for t, q, b in batch])
                for (t, q, b), r in zip(batch, res, strict=True):
                    assert r.queue_offset == len(model.setdefault((t, q), []))
                    model[(t, q)].append(b)
            for (t, q), bodies in model.items():
                assert _bodies(s, t, q) == bodies
                assert s.max_offset(t, q) == len(bodies)
        with MessageStore(_config(root)) as s:  # and again after a clean reopen
            assert s.recovery.clean
            for (t, q), bodies in model.items():
                assert _bodies(s, t, q) == bodies
            assert s.topic_queues() == {t: sorted(q for tt, q in model if tt == t)
                                        for t in sorted({t for t, _ in model})}


def test_roll_over_many_segments_and_reopen(tmp_path: Path) -> None:
    with MessageStore(_config(tmp_path)) as s:
        for i in range(300):
            s.put(MessageIn("roll", i % 2, bytes([i % 256]) * 3000, keys=f"k{i}"))
        assert len(list((tmp_path / "commitlog").iterdir())) > 3
    with MessageStore(_config(tmp_path)) as s:
        assert _bodies(s, "roll", 1) == [bytes([i % 256]) * 3000 for i in range(1, 300, 2)]
        r = s.put(MessageIn("roll", 1, b"after"))
        assert r.queue_offset == 150
        assert [m.body for m in s.query_by_key("roll", "k299", 0, 2**62)] == [bytes([299 % 256]) * 3000]


def test_get_statuses_limits_and_tag_filter(store: MessageStore) -> None:
    assert store.get_messages("t", 0, 0).status is GetStatus.NO_MESSAGE_IN_QUEUE
    for i in range(10):
        store.put(MessageIn("t", 0, b"x" * 100, tags="even" if i % 2 == 0 else "odd"))
    got = store.get_messages("t", 0, 0, max_count=3)
    assert (got.status, len(got.records), got.next_queue_offset) == (GetStatus.FOUND, 3, 3)
    assert (got.min_offset, got.max_offset) == (0, 10)
    size = len(got.records[0])
    got = store.get_messages("t", 0, 0, max_bytes=size * 2 + 1)
    assert len(got.records) == 2 and got.next_queue_offset == 2
    got = store.get_messages("t", 0, 0, max_bytes=1)  # at least one record always
    assert len(got.records) == 1
    got = store.get_messages("t", 0, 2, tag_hashes={tag_hash("odd")})
    assert [decode_record(r).queue_offset for r in got.records] == [3, 5, 7, 9]
    assert got.next_queue_offset == 10
    got = store.get_messages("t", 0, 9, tag_hashes={tag_hash("nope")})
    assert (got.status, got.next_queue_offset) == (GetStatus.NO_MATCHED_MESSAGE, 10)
    assert store.get_messages("t", 0, 10).status is GetStatus.OFFSET_OVERFLOW_ONE
    got = store.get_messages("t", 0, 50)
    assert (got.status, got.next_queue_offset) == (GetStatus.OFFSET_OVERFLOW_BADLY, 10)
    body = b"".join(bytes(r) for r in store.get_messages("t", 0, 0, max_count=10).records)
    assert [m.queue_offset for m in iter_records(body)] == list(range(10))


def test_match_predicate_skips_records_and_moves_past_them(store: MessageStore) -> None:
    for i in range(20):
        store.put(MessageIn("m", 0, str(i).encode(), tags="even" if i % 2 == 0 else "odd",
                            properties=encode_properties({"n": str(i)})))
    seen: list[int] = []

    def every_fifth(raw: memoryview) -> bool:
        msg = decode_record(raw)  # the predicate gets the whole checked record
        seen.append(msg.queue_offset)
        return int(msg.properties["n"]) % 5 == 0

    got = store.get_messages("m", 0, 0, max_count=100, match=every_fifth)
    assert [decode_record(r).body for r in got.records] == [b"0", b"5", b"10", b"15"]
    assert (got.status, got.next_queue_offset) == (GetStatus.FOUND, 20)
    assert seen == list(range(20))
    # max_count stops the scan right after the last record served
    got = store.get_messages("m", 0, 1, max_count=1, match=every_fifth)
    assert [decode_record(r).body for r in got.records] == [b"5"] and got.next_queue_offset == 6
    # both filters: the tag hash first (the predicate never sees an odd record)
    seen.clear()
    got = store.get_messages("m", 0, 0, max_count=100, tag_hashes={tag_hash("odd")},
                             match=every_fifth)
    assert [decode_record(r).body for r in got.records] == [b"5", b"15"]
    assert seen == list(range(1, 20, 2))
    # nothing matches: NO_MATCHED_MESSAGE, the next offset past every skipped record
    got = store.get_messages("m", 0, 3, match=lambda raw: False)
    assert (got.status, got.records, got.next_queue_offset) == (GetStatus.NO_MATCHED_MESSAGE,
                                                                [], 20)
    # a corrupt record is never offered to the predicate (the CRC check comes first)
    res = store.put(MessageIn("m", 0, b"20", properties=encode_properties({"n": "20"})))
    seg_bytes = SMALL["commitlog_segment_bytes"]
    seg_start = res.phy_offset - res.phy_offset % seg_bytes
    path = Path(store.config.root_dir) / "commitlog" / f"{seg_start:020d}"
    with open(path, "r+b") as f:  # the store maps the file shared: it sees the flip
        f.seek(res.phy_offset % seg_bytes + res.size - 1)
        f.write(b"X")
    seen.clear()
    got = store.get_messages("m", 0, 20, match=every_fifth)
    assert (got.status, got.next_queue_offset, seen) == (GetStatus.NO_MATCHED_MESSAGE, 21, [])


def test_a_corrupt_record_in_a_batch_is_skipped_and_the_rest_served(
        store: MessageStore) -> None:
    """Unfiltered reads check a batch's back-to-back records in one call; a damaged one
    among them is still skipped alone, and a pull ending on it moves past it."""
    results = store.put_batch([MessageIn("c", 0, b"%d" % i) for i in range(8)])
    bad = results[3]
    seg_bytes = SMALL["commitlog_segment_bytes"]
    path = Path(store.config.root_dir) / "commitlog" / f"{bad.phy_offset // seg_bytes * seg_bytes:020d}"
    with open(path, "r+b") as f:  # the store maps the file shared: it sees the flip
        f.seek(bad.phy_offset % seg_bytes + bad.size - 1)
        f.write(b"X")
    got = store.get_messages("c", 0, 0, max_count=100)
    assert [decode_record(r).body for r in got.records] == [b"0", b"1", b"2", b"4", b"5",
                                                            b"6", b"7"]
    assert got.next_queue_offset == 8
    got = store.get_messages("c", 0, 3, max_count=1)
    assert got.records == [] and got.next_queue_offset == 4


def test_an_unchecked_read_serves_records_as_stored(store: MessageStore) -> None:
    """check=False (a reader that checks records itself): the damaged record is served
    as it is, for that reader to find; a checked read still skips it."""
    results = store.put_batch([MessageIn("u", 0, b"%d" % i) for i in range(4)])
    bad = results[2]
    seg_bytes = SMALL["commitlog_segment_bytes"]
    path = Path(store.config.root_dir) / "commitlog" / f"{bad.phy_offset // seg_bytes * seg_bytes:020d}"
    with open(path, "r+b") as f:
        f.seek(bad.phy_offset % seg_bytes + bad.size - 1)
        f.write(b"X")
    got = store.get_messages("u", 0, 0, max_count=100, check=False)
    assert [len(r) for r in got.records] == [r.size for r in results]
    assert bytes(got.records[2])[-1:] == b"X" and got.next_queue_offset == 4
    with pytest.raises(CorruptRecordError):
        check_records(memoryview(b"".join(got.records)), 0, sum(r.size for r in results))
    got = store.get_messages("u", 0, 0, max_count=100)
    assert [decode_record(r).body for r in got.records] == [b"0", b"1", b"3"]


def test_a_slow_match_stops_at_the_scan_time_bound(store: MessageStore) -> None:
    for _ in range(5):
        store.put_batch([MessageIn("slow", 0, b"x")] * 200)

    def slow_no(raw: memoryview) -> bool:
        time.sleep(0.001)
        return False

    got = store.get_messages("slow", 0, 0, match=slow_no, max_scan_ms=20)
    # stopped early, at a run boundary, with the offset it reached (one run at least)
    assert got.status is GetStatus.NO_MATCHED_MESSAGE and 1 <= got.next_queue_offset < 1000
    got = store.get_messages("slow", 0, 0, match=lambda raw: True, max_scan_ms=20)
    assert len(got.records) == 32  # a cheap predicate fills the pull as usual
    got = store.get_messages("slow", 0, 0, max_count=1000, max_scan_ms=0)  # no match: no bound
    assert len(got.records) == 1000


def test_replay_by_time(store: MessageStore) -> None:
    stamps = []
    for i in range(30):
        stamps.append(store.put(MessageIn("time", 1, b"%d" % i)).store_ts_ms)
        if i % 10 == 9:
            time.sleep(0.005)
    assert stamps == sorted(stamps)
    for ts in set(stamps):
        assert store.offset_for_timestamp("time", 1, ts) == stamps.index(ts)
    assert store.offset_for_timestamp("time", 1, 0) == 0
    assert store.offset_for_timestamp("time", 1, stamps[-1] + 1) == 30
    assert store.offset_for_timestamp("nope", 1, 0) == 0


def test_query_by_key_and_id(store: MessageStore) -> None:
    props = encode_properties({"region": "eu", "TRACEPARENT": "00-abc"})
    ids = []
    for i in range(20):
        r = store.put(MessageIn("orders", i % 4, b"order %d" % i, keys=f"order-{i} cust-{i % 3}",
                                properties=props, msg_id=new_msg_id(), born_host="10.0.0.5:5"))
        ids.append(r.msg_id)
    store.put(MessageIn("other", 0, b"same key, other topic", keys="cust-1"))
    got = store.query_by_key("orders", "cust-1", 0, 2**62)
    assert sorted(m.body for m in got) == sorted(b"order %d" % i for i in range(20) if i % 3 == 1)
    assert all(m.topic == "orders" for m in got)
    assert len(store.query_by_key("orders", "cust-1", 0, 2**62, max_count=2)) == 2
    assert store.query_by_key("orders", "cust-99", 0, 2**62) == []
    assert store.query_by_key("orders", "order-3", 0, 1) == []  # outside the time range
    msg = store.query_by_id(ids[7])
    assert msg is not None and msg.body == b"order 7" and msg.properties["region"] == "eu"
    assert msg.born_host == "10.0.0.5:5" and msg.store_host == "127.0.0.1:10911"
    assert store.query_by_id(new_msg_id()) is None
    assert store.query_by_id(b"short") is None
    assert store.get_message(msg.phy_offset) == msg
    assert store.get_message(msg.phy_offset + 1) is None
    assert store.get_message(10**12) is None


def test_bad_input_is_rejected_and_nothing_is_written(store: MessageStore) -> None:
    store.put(MessageIn("good", 0, b"first"))
    bad = [
        (MessageIn("bad topic", 0, b""), InvalidNameError),
        (MessageIn("", 0, b""), InvalidNameError),
        (MessageIn("%NOPE%x", 0, b""), InvalidNameError),
        (MessageIn("good", 0, b"x" * (16 * 1024 + 1)), MessageTooLargeError),
        (MessageIn("good", -1, b""), MalformedRequestError),
        (MessageIn("good", 0, b"", msg_id=b"123"), MalformedRequestError),
        (MessageIn("good", 0, b"", tags="t" * 70_000), MessageTooLargeError),
        (MessageIn("good", 0, b"", properties=b"p" * 70_000), MessageTooLargeError),
        (MessageIn("good", 0, "not bytes"), MalformedRequestError),  # type: ignore[arg-type]
        (MessageIn("good", 0, b"", tags=b"bytes"), MalformedRequestError),  # type: ignore[arg-type]
        (MessageIn("good", 0, b"", flags=-1), MalformedRequestError),
        (MessageIn("good", 0, b"", born_ts_ms=1 << 64), MalformedRequestError),
        (MessageIn("good", 0, b"", reconsume_times=1 << 40), MalformedRequestError),
        (MessageIn("good", 0, b"", keys="\ud800"), MalformedRequestError),
        (MessageIn("good", "0", b""), MalformedRequestError),  # type: ignore[arg-type]
        (("good", 0), MalformedRequestError),
    ]
    for msg, exc in bad:
        with pytest.raises(exc):
            store.put_batch([MessageIn("good", 0, b"ok"), msg])  # type: ignore[list-item]
    assert _bodies(store, "good", 0) == [b"first"]
    assert store.put(MessageIn("good", 0, b"second")).queue_offset == 1
    assert store.put(MessageIn("%DLQ%g", 0, b"internal")).queue_offset == 0


def test_sync_mode_wait_durable(tmp_path: Path) -> None:
    with MessageStore(_config(tmp_path, flush_mode=FlushMode.SYNC)) as s:
        results = s.put_batch([MessageIn("s", 0, b"x" * 10) for _ in range(5)])
        s.wait_durable(results[-1].end_offset).result(timeout=5)
        assert s.flushed_offset >= results[-1].end_offset


def test_retention_under_disk_pressure(tmp_path: Path) -> None:
    cfg = _config(tmp_path, disk_usage_fn=lambda _root: 0.99, retention_hours=1000)
    with MessageStore(cfg) as s:
        for i in range(200):
            s.put(MessageIn("r", 0, b"x" * 3000, keys=f"k{i}"))
        before = s.commit_log_min_offset
        report = s.run_retention()
        assert report.deleted_segments == 1 and report.forced_by_disk == 1
        assert s.commit_log_min_offset > before == 0
        got = s.get_messages("r", 0, 0)
        # either the queue moved its minimum or the first records are gone from the log
        assert got.status in (GetStatus.OFFSET_TOO_SMALL, GetStatus.FOUND)
        if got.status is GetStatus.FOUND:
            assert all(decode_record(r).phy_offset >= s.commit_log_min_offset for r in got.records)
        assert s.get_messages("r", 0, 199).status is GetStatus.FOUND
    cfg = _config(tmp_path, disk_usage_fn=lambda _root: 0.1, retention_hours=0)
    with MessageStore(cfg) as s:
        report = s.run_retention(now_ms=int(time.time() * 1000) + 1000)
        assert report.deleted_segments >= 1
        assert s.get_messages("r", 0, 199).status is GetStatus.FOUND


def test_directory_is_locked_and_closed_store_refuses(tmp_path: Path) -> None:
    s = MessageStore(_config(tmp_path))
    with pytest.raises(StoreError):
        MessageStore(_config(tmp_path))
    s.close()
    s.close()  # idempotent
    with pytest.raises(StoreError):
        s.put(MessageIn("t", 0, b""))


async def test_wait_durable_from_asyncio_as_the_broker_uses_it(tmp_path: Path) -> None:
    import asyncio

    with MessageStore(_config(tmp_path, flush_mode=FlushMode.SYNC)) as s:
        async def one(i: int) -> int:
            r = s.put(MessageIn("aio", i % 2, b"m%d" % i))
            await asyncio.wrap_future(s.wait_durable(r.end_offset))
            return r.end_offset

        ends = await asyncio.gather(*(one(i) for i in range(64)))
        assert s.flushed_offset >= max(ends)


def test_readers_on_another_thread_while_appending(tmp_path: Path) -> None:
    import threading

    errors: list[BaseException] = []
    stop = threading.Event()
    with MessageStore(_config(tmp_path)) as s:
        def reader() -> None:
            try:
                while not stop.is_set():
                    for q in range(2):
                        off = 0
                        while True:
                            got = s.get_messages("thr", q, off, max_count=50)
                            if got.status is not GetStatus.FOUND:
                                break
                            for raw in got.records:
                                assert decode_record(raw).queue_offset == off
                                off += 1
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)

        t = threading.Thread(target=reader)
        t.start()
        for i in range(300):
            s.put_batch([MessageIn("thr", i % 2, b"x" * 700, keys=f"k{i}")])
        stop.set()
        t.join()
        assert not errors
        assert s.max_offset("thr", 0) + s.max_offset("thr", 1) == 300


def test_read_raw_returns_checked_record_bytes(store: MessageStore) -> None:
    res = store.put_batch([MessageIn("t", 0, b"one", keys="k"), MessageIn("t", 0, b"two")])
    got = store.get_messages("t", 0, 0)
    assert [store.read_raw(r.phy_offset) for r in res] == [bytes(r) for r in got.records]
    assert decode_record(store.read_raw(res[1].phy_offset) or b"").body == b"two"
    for bad in (-1, res[0].phy_offset + 1, res[1].phy_offset + res[1].size, 1 << 40):
        assert store.read_raw(bad) is None
    seg = store._cl.segment_for(res[1].phy_offset)
    assert seg is not None
    at = res[1].phy_offset - seg.start_offset + res[1].size - 1
    seg.view[at] ^= 1  # bit rot in the body: the CRC check refuses it
    assert store.read_raw(res[1].phy_offset) is None
    seg.view[at] ^= 1
