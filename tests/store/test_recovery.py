"""Recovery: torn tails, flipped bits, garbage, lost checkpoint/queues/index are repaired on open."""
from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

import pytest
from ferry.store import GetStatus, MessageIn, MessageStore, StoreConfig, decode_record
from ferry.store.checkpoint import Checkpoint, read_checkpoint, write_checkpoint

SEG = 256 * 1024


def _config(root: Path) -> StoreConfig:
    return StoreConfig(root_dir=str(root), commitlog_segment_bytes=SEG, max_message_bytes=16384,
                       cq_entries_per_segment=16, index_max_slots=64, index_max_entries=256)


def _fill(root: Path, n: int = 60) -> list[tuple[int, int, bytes]]:
    """n messages over 3 queues, closed cleanly; returns (phy, size, msg_id) of each."""
    with MessageStore(_config(root)) as s:
        res = s.put_batch([MessageIn("rec", i % 3, b"body-%d" % i * 1500, keys=f"key-{i}")
                           for i in range(n)])
        return [(r.phy_offset, r.size, r.msg_id) for r in res]


def _crash_checkpoint(root: Path, commit: int = 0, dispatch: int = 0) -> None:
    """Make the last stop look like a crash, durable only up to the given offsets."""
    write_checkpoint(str(root), Checkpoint(commit, dispatch, False))


def _segment_file(root: Path, phy: int) -> Path:
    return root / "commitlog" / f"{phy - phy % SEG:020d}"


def _served(s: MessageStore) -> list[int]:
    """The phy offsets of every record served by every queue (each decoded and checked)."""
    phys = []
    for topic, qids in s.topic_queues().items():
        for q in qids:
            off = s.min_offset(topic, q)
            while True:
                got = s.get_messages(topic, q, off, max_count=64)
                if got.status is not GetStatus.FOUND:
                    break
                for raw in got.records:
                    m = decode_record(raw)
                    assert (m.topic, m.queue_id) == (topic, q) and m.queue_offset >= off
                    phys.append(m.phy_offset)
                    off = m.queue_offset + 1
                off = got.next_queue_offset
    return sorted(phys)


@pytest.mark.parametrize("damage", ["torn", "bitflip", "garbage_after_end"])
def test_damaged_tail_is_cut(tmp_path: Path, damage: str, caplog: pytest.LogCaptureFixture) -> None:
    recs = _fill(tmp_path)
    k = 45  # the first damaged record
    phy, size, _ = recs[k]
    path = _segment_file(tmp_path, phy)
    data = bytearray(path.read_bytes())
    rel = phy % SEG
    if damage == "torn":  # only the first part of the record (and nothing after) reached disk
        data[rel + size // 2:] = bytes(len(data) - rel - size // 2)
        for later in recs[k + 1:]:
            if _segment_file(tmp_path, later[0]) != path:
                _segment_file(tmp_path, later[0]).unlink(missing_ok=True)
    elif damage == "bitflip":
        data[rel + size - 3] ^= 0x04
    else:  # a valid log up to k, then random bytes where record k starts
        data[rel:rel + 500] = os.urandom(500)
    path.write_bytes(bytes(data))
    _crash_checkpoint(tmp_path)
    with caplog.at_level(logging.WARNING, logger="ferry.store"):
        s = MessageStore(_config(tmp_path))
    try:
        assert not s.recovery.clean and s.recovery.cut_reason is not None
        assert s.recovery.write_offset == phy
        assert any("cut at offset" in r.getMessage() for r in caplog.records)
        assert _served(s) == [r[0] for r in recs[:k]]
        assert s.query_by_id(recs[k][2]) is None and s.query_by_id(recs[k - 1][2]) is not None
        assert s.query_by_key("rec", f"key-{k}", 0, 2**62) == []
        assert [m.queue_offset for m in s.query_by_key("rec", "key-44", 0, 2**62)] == [44 // 3]
        # appends continue right after the last good record, queue offsets without a gap
        r = s.put(MessageIn("rec", k % 3, b"new"))
        assert (r.phy_offset, r.queue_offset) == (phy, k // 3)
    finally:
        s.close()
    with MessageStore(_config(tmp_path)) as s:
        assert s.recovery.clean
        assert len(_served(s)) == k + 1


def test_unflushed_tail_after_checkpoint_is_kept_when_valid(tmp_path: Path) -> None:
    recs = _fill(tmp_path)
    _crash_checkpoint(tmp_path, commit=recs[10][0], dispatch=recs[5][0])
    with MessageStore(_config(tmp_path)) as s:
        assert s.recovery.cut_reason is None and s.recovery.scanned_from == recs[10][0]
        assert s.recovery.records_scanned == 50
        assert _served(s) == [r[0] for r in recs]
        assert all(s.query_by_id(r[2]) is not None for r in recs)


def test_lost_queues_and_index_are_rebuilt(tmp_path: Path) -> None:
    recs = _fill(tmp_path)
    shutil.rmtree(tmp_path / "consumequeue")
    shutil.rmtree(tmp_path / "index")
    (tmp_path / "checkpoint").unlink()
    with MessageStore(_config(tmp_path)) as s:
        assert not s.recovery.clean
        assert s.recovery.records_redispatched == 60
        assert _served(s) == [r[0] for r in recs]
        assert all(s.query_by_id(r[2]) is not None for r in recs)
        assert len(s.query_by_key("rec", "key-7", 0, 2**62)) == 1
        assert s.put(MessageIn("rec", 0, b"next")).queue_offset == 20


def test_queue_entries_past_the_log_end_are_dropped(tmp_path: Path) -> None:
    recs = _fill(tmp_path)
    # the commit log lost its last 20 records, the queues and index did not
    cut_phy = recs[40][0]
    path = _segment_file(tmp_path, cut_phy)
    data = bytearray(path.read_bytes())
    data[cut_phy % SEG:] = bytes(len(data) - cut_phy % SEG)
    path.write_bytes(bytes(data))
    for seg in (tmp_path / "commitlog").iterdir():
        if int(seg.name) > int(path.name):
            seg.unlink()
    _crash_checkpoint(tmp_path, commit=recs[5][0], dispatch=recs[60 - 1][0] + 1)
    with MessageStore(_config(tmp_path)) as s:
        assert _served(s) == [r[0] for r in recs[:40]]
        assert sum(s.max_offset("rec", q) for q in range(3)) == 40
        assert s.query_by_id(recs[50][2]) is None


def test_clean_open_is_fast_path_and_checkpoint_is_unclean_while_open(tmp_path: Path) -> None:
    _fill(tmp_path)
    s = MessageStore(_config(tmp_path))
    try:
        assert s.recovery.clean and s.recovery.records_scanned == 0
        cp = read_checkpoint(str(tmp_path))
        assert cp is not None and not cp.clean  # a crash from here on is seen as one
    finally:
        s.close()
    cp = read_checkpoint(str(tmp_path))
    assert cp is not None and cp.clean


def test_damage_inside_the_trusted_log_is_never_served(tmp_path: Path,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    recs = _fill(tmp_path)
    phy, size, msg_id = recs[20]
    path = _segment_file(tmp_path, phy)
    data = bytearray(path.read_bytes())
    data[phy % SEG + size - 10] ^= 0xFF  # bit rot after a clean close: no scan on open
    path.write_bytes(bytes(data))
    with caplog.at_level(logging.ERROR, logger="ferry.store"), \
            MessageStore(_config(tmp_path)) as s:
        assert s.recovery.clean
        served = _served(s)
        assert phy not in served and len(served) == 59
        assert any("corrupt record" in r.getMessage() for r in caplog.records)
        assert s.query_by_id(msg_id) is None
        assert s.get_message(phy) is None


@pytest.mark.parametrize("damage", ["body-bit", "zero-size"])
def test_bit_rot_below_the_checkpoint_cuts_the_log_there(tmp_path: Path, damage: str) -> None:
    recs = _fill(tmp_path)
    end = recs[-1][0] + recs[-1][1]
    # The checkpoint says: durable to the end, nothing dispatched (re-dispatch it all,
    # none of it re-verified by the scan).
    _crash_checkpoint(tmp_path, commit=end, dispatch=0)
    phy, size, _ = recs[30]
    with open(_segment_file(tmp_path, phy), "r+b") as f:
        if damage == "body-bit":
            f.seek(phy % SEG + size - 1)
            last = f.read(1)[0]
            f.seek(phy % SEG + size - 1)
            f.write(bytes([last ^ 1]))
        else:
            f.seek(phy % SEG)
            f.write(bytes(4))  # size 0 once looped forever
    with MessageStore(_config(tmp_path)) as s:
        assert s.recovery.write_offset == phy and s.recovery.cut_reason
        assert _served(s) == [r[0] for r in recs[:30]]
        assert sum(s.max_offset("rec", q) for q in range(3)) == 30
        res = s.put(MessageIn("rec", 0, b"after"))
        assert res.phy_offset == phy and res.queue_offset == 10
