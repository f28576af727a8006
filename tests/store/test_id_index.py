"""Message ids indexed by run (id_index.py): few index entries per batch, every id found."""
from __future__ import annotations

import shutil
from pathlib import Path

from ferry.codec.entry import append_entry
from ferry.codec.msg_id import new_msg_id
from ferry.store import MessageIn, MessageStore, StoreConfig, decode_record
from ferry.store.checkpoint import Checkpoint, write_checkpoint
from ferry.store.index_file import IndexService
from ferry.store.index_keys import MAX_ID_RUN, exact_id_key, key_hash

SMALL = dict(commitlog_segment_bytes=256 * 1024, max_message_bytes=16 * 1024,
             index_max_slots=512, index_max_entries=4096)


def _config(root: Path) -> StoreConfig:
    return StoreConfig(root_dir=str(root), **SMALL)  # type: ignore[arg-type]


def _send_body(ids: list[bytes], size: int = 300) -> bytes:
    parts: list[bytes] = []
    for msg_id in ids:
        append_entry(parts, msg_id, 1, 0, b"", b"", b"", msg_id * (size // 16))
    return b"".join(parts)


def _index_entries(store: MessageStore) -> int:
    index: IndexService = store._index
    return sum(f.count for f in index._files)


def test_a_batch_of_consecutive_ids_takes_one_index_entry_per_16_ids(tmp_path: Path) -> None:
    ids = [new_msg_id() for _ in range(256)]
    with MessageStore(_config(tmp_path)) as s:
        s.put_encoded_batch("t", 0, _send_body(ids))
        s.query_by_id(ids[0])  # (applies the dispatch)
        # 256 consecutive counters span at most 17 windows of 16 ids; segment rolls
        # (300-byte records, 256 KiB segments) cut a run too.
        assert _index_entries(s) <= 256 // MAX_ID_RUN + 2
        assert all(getattr(s.query_by_id(i), "msg_id", None) == i for i in ids)
        # store-assigned ids (all zero in the entry) are found as well
        res = s.put_encoded_batch("t", 1, _send_body([bytes(16)] * 40))
        got = s.get_messages("t", 1, res.first_queue_offset, 40)
        for raw in got.records:
            rec = decode_record(raw)
            assert s.query_by_id(rec.msg_id).phy_offset == rec.phy_offset  # type: ignore[union-attr]


def test_mixed_and_repeated_ids_are_all_found(tmp_path: Path) -> None:
    # user ids with no common prefix, runs cut every MAX_ID_RUN, an id stored twice
    odd = [bytes([i]) * 16 for i in range(1, 30)]
    many = [new_msg_id() for _ in range(700)]
    with MessageStore(_config(tmp_path)) as s:
        s.put_encoded_batch("t", 0, _send_body(odd + many[:300] + odd[:3]))
        s.put_batch([MessageIn("u", 2, b"x", msg_id=i) for i in many[300:]])
        for msg_id in odd + many:
            found = s.query_by_id(msg_id)
            assert found is not None and found.msg_id == msg_id
        assert s.query_by_id(b"\xee" * 16) is None


def test_recovery_rebuilds_id_runs_that_find_every_id(tmp_path: Path) -> None:
    ids = [new_msg_id() for _ in range(600)]
    with MessageStore(_config(tmp_path)) as s:
        for at in range(0, 600, 100):
            s.put_encoded_batch("t", at // 100 % 3, _send_body(ids[at:at + 100], 900))
    shutil.rmtree(tmp_path / "index")
    write_checkpoint(str(tmp_path), Checkpoint(0, 0, False))  # re-dispatch everything
    with MessageStore(_config(tmp_path)) as s:
        assert s.recovery.records_redispatched == 600
        assert all(s.query_by_id(i) is not None for i in ids)


def test_ids_indexed_one_by_one_by_older_stores_are_still_found(tmp_path: Path) -> None:
    ids = [new_msg_id() for _ in range(5)]
    with MessageStore(_config(tmp_path)) as s:
        s.put_encoded_batch("t", 0, _send_body(ids))
        stored = [s.query_by_id(i) for i in ids]
        phys = [m.phy_offset for m in stored]  # type: ignore[union-attr]
        # an older store's index: no run keys, one b"I" + msg_id key per record
        s._index.drop_from(0)
        assert s.query_by_id(ids[2]) is None
        s._index.put_hashed([(key_hash(exact_id_key(m.msg_id)), m.phy_offset,  # type: ignore[union-attr]
                               m.store_ts_ms) for m in stored])
        assert [s.query_by_id(i).phy_offset for i in ids] == phys  # type: ignore[union-attr]


def test_a_producers_one_message_puts_are_found_reading_each_record_once(tmp_path: Path) -> None:
    # Half messages: one put per message, each its own run, all of one id prefix.
    ids = [new_msg_id() for _ in range(200)]
    with MessageStore(_config(tmp_path)) as s:
        for msg_id in ids:
            s.put_batch([MessageIn("%HALF%", 0, b"h", msg_id=msg_id)])
        cl = s._cl
        reads = 0
        real_read = cl.read

        def counting_read(phy: int, size: int) -> memoryview | None:
            nonlocal reads
            reads += 1
            return real_read(phy, size)

        cl.read = counting_read  # type: ignore[method-assign,assignment]
        assert s.query_by_id(ids[0]).msg_id == ids[0]  # type: ignore[union-attr]
        # the records of the id's window (16 ids), not every half of its producer
        assert reads <= 3 * MAX_ID_RUN


def test_the_newest_copy_of_an_id_answers_also_inside_one_run(tmp_path: Path) -> None:
    # A transaction's half and its committed copy share the id; the put path starts a
    # run at each put, but a re-dispatch joins back-to-back records of one prefix.
    base = new_msg_id()[:15]
    ids = [base + bytes((0x40 + i,)) for i in range(4)]  # four ids of one window
    with MessageStore(_config(tmp_path)) as s:
        s.put_batch([MessageIn("%HALF%", 0, b"half", msg_id=ids[0])])
        s.put_batch([MessageIn("t", 0, b"other", msg_id=i) for i in ids[1:]])
        s.put_batch([MessageIn("t", 1, b"real", msg_id=ids[0])])
        assert s.query_by_id(ids[0]).body == b"real"  # type: ignore[union-attr]
    shutil.rmtree(tmp_path / "index")
    write_checkpoint(str(tmp_path), Checkpoint(0, 0, False))
    with MessageStore(_config(tmp_path)) as s:
        assert _index_entries(s) == 1  # one run over all five records (one window)
        assert s.query_by_id(ids[0]).body == b"real"  # type: ignore[union-attr]
