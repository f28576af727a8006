"""Replication groundwork (issue 9): a master's log streamed into a slave, byte for byte.

read_log on the master, append_replicated on the slave, truncate_to for a slave whose
tail diverged; every store is a real MessageStore on disk with small segments (so
chunks cross segment ends and end-of-segment markers travel too).
"""
from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from crc32c import crc32c
from ferry.codec.record import AT_CRC, AT_PHY_OFFSET, CRC_START, HEADER_SIZE, U32
from ferry.errors import StoreError
from ferry.store import FlushMode, GetStatus, MessageIn, MessageStore, StoreConfig, new_msg_id

SMALL = dict(commitlog_segment_bytes=256 * 1024, max_message_bytes=16 * 1024,
             cq_entries_per_segment=32, index_max_slots=512, index_max_entries=4096,
             checkpoint_interval_ms=50, flush_interval_ms=20)
TOPICS = ("orders", "audit", "%RETRY%g1")


def _config(root: Path, **kw: object) -> StoreConfig:
    return StoreConfig(root_dir=str(root), **{**SMALL, **kw})  # type: ignore[arg-type]


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[MessageStore, MessageStore]]:
    master = MessageStore(_config(tmp_path / "master"))
    slave = MessageStore(_config(tmp_path / "slave"))
    yield master, slave
    master.close()
    slave.close()


def _fill(store: MessageStore, count: int, seed: int, tag: str = "m") -> list[tuple[bytes, str]]:
    """Put `count` keyed messages in batches; return their (msg id, key)."""
    rng = random.Random(seed)
    out: list[tuple[bytes, str]] = []
    while len(out) < count:
        batch = []
        for _ in range(min(rng.randint(1, 8), count - len(out))):
            msg_id, key = new_msg_id(), f"{tag}-{len(out) + len(batch)}"
            batch.append(MessageIn(rng.choice(TOPICS), rng.randint(0, 2),
                                   rng.randbytes(rng.randint(0, 8000)), keys=f"{key} shared",
                                   tags=rng.choice(["", "a", "b"]), msg_id=msg_id))
        store.put_batch(batch)
        out += [(m.msg_id, m.keys.split(" ")[0]) for m in batch]  # type: ignore[union-attr]
    return out


def _replicate(master: MessageStore, slave: MessageStore, max_bytes: int) -> int:
    """Stream the master's log into the slave from the slave's end; return the chunks."""
    chunks = 0
    while True:
        data = master.read_log(slave.commit_log_max_offset, max_bytes)
        if not data:
            return chunks
        end = slave.append_replicated(slave.commit_log_max_offset, data)
        assert end == slave.commit_log_max_offset
        chunks += 1


def _whole_log(store: MessageStore) -> bytes:
    parts, pos = [], store.commit_log_min_offset
    while chunk := store.read_log(pos, 1 << 20):
        parts.append(chunk)
        pos += len(chunk)
    assert pos == store.commit_log_max_offset
    return b"".join(parts)


def _queue(store: MessageStore, topic: str, qid: int) -> list[bytes]:
    out, offset = [], 0
    while True:
        got = store.get_messages(topic, qid, offset, max_count=50)
        if got.status is not GetStatus.FOUND:
            return out
        out += [bytes(r) for r in got.records]
        offset = got.next_queue_offset


def _assert_same(master: MessageStore, slave: MessageStore, msgs: list[tuple[bytes, str]]) -> None:
    assert slave.commit_log_max_offset == master.commit_log_max_offset
    assert _whole_log(slave) == _whole_log(master)
    assert slave.topic_queues() == master.topic_queues()
    for topic, qids in master.topic_queues().items():
        for qid in qids:
            assert slave.max_offset(topic, qid) == master.max_offset(topic, qid)
            assert _queue(slave, topic, qid) == _queue(master, topic, qid)
    for msg_id, key in msgs[::7]:
        on_master = master.query_by_id(msg_id)
        assert on_master is not None and slave.query_by_id(msg_id) == on_master
        for topic in TOPICS:
            assert (slave.query_by_key(topic, key, 0, 2**62)
                    == master.query_by_key(topic, key, 0, 2**62))
    for topic in TOPICS:
        assert ([m.phy_offset for m in slave.query_by_key(topic, "shared", 0, 2**62, 500)]
                == [m.phy_offset for m in master.query_by_key(topic, "shared", 0, 2**62, 500)])


@pytest.mark.parametrize("max_bytes", [1, 5000, 200_000])
def test_a_streamed_log_is_byte_identical_and_serves_the_same(
        pair: tuple[MessageStore, MessageStore], max_bytes: int) -> None:
    master, slave = pair
    msgs = _fill(master, 300, seed=max_bytes)
    assert len(master.read_log(0, 1)) > 1  # at least one whole record, even over max_bytes
    chunks = _replicate(master, slave, max_bytes)
    assert master.commit_log_max_offset > 3 * SMALL["commitlog_segment_bytes"]  # markers went too
    if max_bytes == 1:
        assert chunks >= 300
    _assert_same(master, slave, msgs)
    # the slave keeps following as the master writes on
    msgs += _fill(master, 40, seed=7, tag="later")
    _replicate(master, slave, max_bytes)
    _assert_same(master, slave, msgs)


def test_a_promoted_slave_continues_the_queues(pair: tuple[MessageStore, MessageStore]) -> None:
    master, slave = pair
    _fill(master, 60, seed=1)
    _replicate(master, slave, 10_000)
    before = {(t, q): slave.max_offset(t, q) for t, qs in slave.topic_queues().items() for q in qs}
    r = slave.put(MessageIn("orders", 1, b"after promotion"))
    assert r.queue_offset == before[("orders", 1)]
    last = slave.get_messages("orders", 1, r.queue_offset).records
    assert len(last) == 1


def test_read_log_refuses_offsets_that_are_no_record_start(
        pair: tuple[MessageStore, MessageStore]) -> None:
    master, _ = pair
    _fill(master, 20, seed=2)
    end = master.commit_log_max_offset
    assert master.read_log(end, 4096) == b""
    for bad in (1, -1, end + 1, end + 10**9):
        with pytest.raises(StoreError):
            master.read_log(bad, 4096)
    with pytest.raises(StoreError):
        master.read_log(0, 0)


def test_append_at_another_offset_names_both(pair: tuple[MessageStore, MessageStore]) -> None:
    master, slave = pair
    _fill(master, 10, seed=3)
    first = master.read_log(0, 1)
    with pytest.raises(StoreError, match=f"{len(first)}.*ends at 0"):
        slave.append_replicated(len(first), master.read_log(len(first), 1))


def _corruptions(chunk: bytes) -> dict[str, bytes]:
    flipped = bytearray(chunk)
    flipped[-1] ^= 0xFF  # last body byte: the CRC fails
    bad_crc = bytearray(chunk)
    bad_crc[AT_CRC] ^= 1
    moved = bytearray(chunk)
    moved[AT_PHY_OFFSET] ^= 8  # the record names another offset as its own
    return {"torn": chunk[:-3], "torn header": chunk[:50], "garbage": os.urandom(len(chunk)),
            "zeros": bytes(len(chunk)), "flipped body": bytes(flipped),
            "bad crc": bytes(bad_crc), "other offset": bytes(moved),
            "trailing bytes": chunk + b"\x01\x02"}


def test_bad_chunks_are_refused_with_nothing_written(
        pair: tuple[MessageStore, MessageStore]) -> None:
    master, slave = pair
    msgs = _fill(master, 30, seed=4)
    _replicate(master, slave, 1)
    _fill(master, 5, seed=5, tag="next")
    end = slave.commit_log_max_offset
    chunk = master.read_log(end, 1 << 20)
    for name, bad in _corruptions(chunk).items():
        with pytest.raises(StoreError, match="refused|nothing written"):
            slave.append_replicated(end, bad)
        assert slave.commit_log_max_offset == end, name
        assert slave.failure is None, name
    assert _whole_log(slave) == _whole_log(master)[:end]
    slave.append_replicated(end, chunk)  # the good chunk still goes in
    _assert_same(master, slave, msgs)


def test_a_record_with_an_unexpected_queue_offset_is_refused(
        pair: tuple[MessageStore, MessageStore]) -> None:
    master, slave = pair
    master.put(MessageIn("orders", 0, b"one"))
    slave.put(MessageIn("orders", 0, b"x" * 3))  # same size, so the chunk lands at its offset
    end = slave.commit_log_max_offset
    master.put(MessageIn("orders", 0, b"two"))
    chunk = master.read_log(end, 4096)
    slave.truncate_to(0)
    slave.put(MessageIn("orders", 1, b"one"))  # the slave's orders/0 is empty again
    assert slave.commit_log_max_offset == end
    with pytest.raises(StoreError, match="queue offset 1 of orders/0.*expects 0"):
        slave.append_replicated(end, chunk)
    assert slave.commit_log_max_offset == end


def _small_tail(master: MessageStore, slave: MessageStore) -> list[int]:
    """Replicate what the master has, then put 10 small records there; their phy offsets."""
    _fill(master, 30, seed=13)
    _replicate(master, slave, 1 << 20)
    got = master.put_batch([MessageIn("orders", i % 3, b"x" * 200, keys=f"t{i}")
                            for i in range(10)])
    return [r.phy_offset for r in got]


def _patch(store: MessageStore, phy: int, data: bytes) -> None:
    """Overwrite bytes of the store's commit-log file at `phy` (damage on disk)."""
    seg = SMALL["commitlog_segment_bytes"]
    path = Path(store.config.root_dir) / "commitlog" / f"{phy // seg * seg:020d}"
    with open(path, "r+b") as f:
        f.seek(phy % seg)
        f.write(data)


def test_a_record_damaged_on_the_master_never_reaches_a_slave(
        pair: tuple[MessageStore, MessageStore]) -> None:
    master, slave = pair
    phys = _small_tail(master, slave)
    end = slave.commit_log_max_offset
    assert phys[0] == end
    last_byte = phys[3] - 1  # the body of the third record
    _patch(master, last_byte, bytes([master.read_log(phys[2], 1)[-1] ^ 0xFF]))
    # read_log does not re-compute the CRCs past its first record: the chunk carries it...
    chunk = master.read_log(end, 1 << 20)
    assert len(chunk) == master.commit_log_max_offset - end
    # ...and the slave refuses the whole chunk, naming the record
    with pytest.raises(StoreError, match=f"crc mismatch.*commit-log offset {phys[2]}"):
        slave.append_replicated(end, chunk)
    assert slave.commit_log_max_offset == end and slave.failure is None
    # what lies before it still goes in; a read starting at it is refused on the master
    slave.append_replicated(end, master.read_log(end, phys[2] - end))
    assert slave.commit_log_max_offset == phys[2]
    with pytest.raises(StoreError, match=f"no valid record starts at {phys[2]}"):
        master.read_log(phys[2], 1 << 20)


def test_read_log_ends_a_chunk_before_a_unit_of_impossible_size(
        pair: tuple[MessageStore, MessageStore]) -> None:
    master, slave = pair
    phys = _small_tail(master, slave)
    _patch(master, phys[4], U32.pack(3))  # a record's total_size below a header's
    end = master.commit_log_max_offset
    # a chunk cut short by max_bytes walks the sizes: it stops before the damage
    assert len(master.read_log(phys[0], end - phys[0] - 1)) == phys[4] - phys[0]
    with pytest.raises(StoreError, match=f"no valid record starts at {phys[4]}"):
        master.read_log(phys[4], 1 << 20)
    # the whole rest is sent without a walk: the slave refuses it, nothing written
    with pytest.raises(StoreError, match=f"refused.*commit-log offset {phys[4]}"):
        slave.append_replicated(phys[0], master.read_log(phys[0], 1 << 20))
    assert slave.commit_log_max_offset == phys[0]


_BODY_LEN_AT = HEADER_SIZE - U32.size  # the header's last field
_RECRC_DAMAGE = {  # (byte, bits flipped, the refusal): then the CRC is made to match again
    "topic not UTF-8": (HEADER_SIZE, 0x80, "not UTF-8"),
    "another phy offset": (AT_PHY_OFFSET, 0x08, "claims another phy offset"),
    "part lengths": (_BODY_LEN_AT, 0x01, "do not add up"),
}


@pytest.mark.parametrize("damage", sorted(_RECRC_DAMAGE))
def test_a_record_with_a_good_crc_but_bad_fields_is_refused(
        pair: tuple[MessageStore, MessageStore], damage: str) -> None:
    master, slave = pair
    _small_tail(master, slave)
    end = slave.commit_log_max_offset
    at, bits, why = _RECRC_DAMAGE[damage]
    chunk = master.read_log(end, 1 << 20)
    bad = bytearray(chunk)
    bad[at] ^= bits
    size = U32.unpack_from(bad, 0)[0]
    U32.pack_into(bad, AT_CRC, crc32c(bytes(bad[CRC_START:size])))
    with pytest.raises(StoreError, match=f"refused.*{why}"):
        slave.append_replicated(end, bytes(bad))
    assert slave.commit_log_max_offset == end and slave.failure is None
    slave.append_replicated(end, chunk)


def test_append_replicated_reports_the_queues_it_touched(
        pair: tuple[MessageStore, MessageStore]) -> None:
    master, slave = pair
    master.put_batch([MessageIn("orders", 0, b"a"), MessageIn("audit", 2, b"b"),
                      MessageIn("orders", 0, b"c")])
    touched: set[tuple[str, int]] = set()
    slave.append_replicated(0, master.read_log(0, 1 << 20), touched)
    assert touched == {("orders", 0), ("audit", 2)}
    assert slave.max_offset("orders", 0) == 2 and slave.max_offset("audit", 2) == 1


def test_truncate_then_follow_a_different_tail(pair: tuple[MessageStore, MessageStore]) -> None:
    master, slave = pair
    common = _fill(master, 80, seed=6)
    _replicate(master, slave, 20_000)
    cut = slave.commit_log_max_offset
    # the slave was a master for a while (its own tail), the master wrote another one
    own = _fill(slave, 50, seed=8, tag="own")
    theirs = _fill(master, 70, seed=9, tag="theirs")
    with pytest.raises(StoreError):
        slave.append_replicated(slave.commit_log_max_offset, master.read_log(cut, 4096))
    slave.truncate_to(cut)
    assert slave.commit_log_max_offset == cut
    for msg_id, key in own:
        assert slave.query_by_id(msg_id) is None
        assert slave.query_by_key("orders", key, 0, 2**62) == []
    _replicate(master, slave, 20_000)
    _assert_same(master, slave, common + theirs)
    for msg_id, _ in own[::5]:
        assert slave.query_by_id(msg_id) is None


def test_truncate_to_refuses_a_point_inside_a_record(
        pair: tuple[MessageStore, MessageStore]) -> None:
    master, _ = pair
    _fill(master, 10, seed=10)
    end = master.commit_log_max_offset
    for bad in (3, end + 1, -1):
        with pytest.raises(StoreError, match="not the start of a record"):
            master.truncate_to(bad)
    assert master.commit_log_max_offset == end
    master.truncate_to(end)  # the end itself: nothing to drop
    assert master.commit_log_max_offset == end


_CHILD = """
import sys, time
from ferry.store import MessageStore, StoreConfig
cfg = StoreConfig(root_dir=sys.argv[1], **{conf})
store = MessageStore(cfg)
store.truncate_to(int(sys.argv[2]))
print("done", flush=True)
time.sleep(600)
"""


@pytest.mark.parametrize("where", ["segment start", "mid segment", "last segment"])
def test_a_kill_right_after_truncate_recovers_the_truncated_log(tmp_path: Path,
                                                                where: str) -> None:
    root = tmp_path / "store"
    with MessageStore(_config(root)) as store:
        msgs = _fill(store, 200, seed=11)
        log = _whole_log(store)
        seg = SMALL["commitlog_segment_bytes"]
        phys = sorted(m.phy_offset for i, _ in msgs if (m := store.query_by_id(i)))
        if where == "segment start":
            cut = 2 * seg
        elif where == "mid segment":
            cut = next(p for p in phys if p > 2 * seg + 100)
        else:  # in the segment the log ends in
            cut = next(p for p in phys if p > len(log) // seg * seg)
        kept = {i for i, _ in msgs if (m := store.query_by_id(i)) and m.phy_offset < cut}
    # No periodic checkpoint in the child: what truncate_to itself leaves must recover.
    child_conf = {**SMALL, "checkpoint_interval_ms": 600_000}
    with subprocess.Popen([sys.executable, "-c", _CHILD.replace("{conf}", repr(child_conf)),
                           str(root), str(cut)], stdout=subprocess.PIPE,
                          env=os.environ.copy()) as proc:
        try:
            assert proc.stdout is not None and proc.stdout.readline() == b"done\n"
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
    with MessageStore(_config(root)) as store:
        assert not store.recovery.clean
        # a plain scan from below the cut, not the bit-rot path of a hole of zeros
        assert store.recovery.scanned_from <= cut
        assert store.commit_log_max_offset == cut
        assert _whole_log(store) == log[:cut]
        for msg_id, _ in msgs:
            assert (store.query_by_id(msg_id) is not None) == (msg_id in kept)
        total = sum(len(_queue(store, t, q)) for t, qs in store.topic_queues().items()
                    for q in qs)
        assert total == len(kept)
        store.put(MessageIn("orders", 0, b"after"))  # and it takes appends again


def test_a_sync_slave_returns_once_the_chunk_is_durable(tmp_path: Path) -> None:
    with MessageStore(_config(tmp_path / "m")) as master, \
            MessageStore(_config(tmp_path / "s", flush_mode=FlushMode.SYNC)) as slave:
        _fill(master, 50, seed=12)
        while data := master.read_log(slave.commit_log_max_offset, 30_000):
            end = slave.append_replicated(slave.commit_log_max_offset, data)
            assert slave.flushed_offset >= end
        assert slave.commit_log_max_offset == master.commit_log_max_offset
