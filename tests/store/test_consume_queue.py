"""Consume queue: round trips, segment crossing, reopen, truncation and retention."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from ferry.errors import InvalidNameError, StoreError
from ferry.store.consume_queue import CQ_ENTRY, ConsumeQueue, segment_name
from ferry.store.consume_queues import ConsumeQueues
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st


def entries(start_phy: int, n: int, size: int = 100) -> list[tuple[int, int, int]]:
    """n entries of `size`-byte records laid out back to back from start_phy."""
    return [(start_phy + i * size, size, (i % 7) + 1) for i in range(n)]


def pack(items: list[tuple[int, int, int]]) -> bytes:
    return b"".join(CQ_ENTRY.pack(*e) for e in items)


def seg_files(root: Path, topic: str = "t", qid: int = 0) -> list[str]:
    return sorted(os.listdir(root / "consumequeue" / topic / str(qid)))


def test_entry_is_20_bytes() -> None:
    assert CQ_ENTRY.size == 20


def test_empty_queue(tmp_path: Path) -> None:
    cq = ConsumeQueue(str(tmp_path), "t", 0, entries_per_segment=8)
    assert (cq.min_offset, cq.max_offset) == (0, 0)
    assert cq.get(0, 10) == []
    assert cq.last_entry() is None
    cq.close()


def test_append_get_round_trip_across_segments(tmp_path: Path) -> None:
    cq = ConsumeQueue(str(tmp_path), "t", 0, entries_per_segment=8)
    all_entries = entries(0, 30)
    cq.append(0, pack(all_entries[:5]))
    cq.append(5, pack(all_entries[5:27]))  # crosses two segment boundaries
    cq.append(27, pack(all_entries[27:]))
    assert cq.max_offset == 30
    assert cq.get(0, 100) == all_entries
    assert cq.get(6, 5) == all_entries[6:11]
    assert cq.get(7, 10) == all_entries[7:17]
    assert cq.get(29, 10) == all_entries[29:]
    assert cq.get(30, 10) == []
    assert cq.last_entry() == all_entries[-1]
    assert seg_files(tmp_path) == [segment_name(0), segment_name(8), segment_name(16), segment_name(24)]
    cq.close()


def test_reopen_finds_min_and_max(tmp_path: Path) -> None:
    cq = ConsumeQueue(str(tmp_path), "t", 2, entries_per_segment=8)
    cq.append(0, pack(entries(0, 19)))
    cq.close()
    again = ConsumeQueue(str(tmp_path), "t", 2, entries_per_segment=8)
    assert (again.min_offset, again.max_offset) == (0, 19)
    assert again.get(0, 100) == entries(0, 19)
    again.append(19, pack(entries(1900, 1)))
    assert again.max_offset == 20
    again.close()


def test_reopen_exactly_full_segment_and_empty_trailing_segment(tmp_path: Path) -> None:
    cq = ConsumeQueue(str(tmp_path), "t", 0, entries_per_segment=8)
    cq.append(0, pack(entries(0, 8)))
    cq.close()
    # A roll that created the next segment but crashed before writing to it.
    with open(tmp_path / "consumequeue" / "t" / "0" / segment_name(8), "wb") as f:
        f.truncate(8 * 20)
    with open(tmp_path / "consumequeue" / "t" / "0" / (segment_name(16) + ".tmp"), "wb") as f:
        f.truncate(3)
    again = ConsumeQueue(str(tmp_path), "t", 0, entries_per_segment=8)
    assert again.max_offset == 8
    assert seg_files(tmp_path) == [segment_name(0)]
    again.append(8, pack(entries(800, 3)))
    assert again.get(7, 5) == entries(0, 8)[7:] + entries(800, 3)
    again.close()


def test_reopen_ignores_torn_entry_without_size(tmp_path: Path) -> None:
    cq = ConsumeQueue(str(tmp_path), "t", 0, entries_per_segment=8)
    cq.append(0, pack(entries(0, 3)))
    cq.close()
    path = tmp_path / "consumequeue" / "t" / "0" / segment_name(0)
    with open(path, "r+b") as f:  # phy landed, size did not
        f.seek(3 * 20)
        f.write((12345).to_bytes(8, "little"))
    again = ConsumeQueue(str(tmp_path), "t", 0, entries_per_segment=8)
    assert again.max_offset == 3
    again.close()


def test_gap_and_bad_length_are_rejected(tmp_path: Path) -> None:
    cq = ConsumeQueue(str(tmp_path), "t", 0, entries_per_segment=8)
    cq.append(0, pack(entries(0, 2)))
    with pytest.raises(StoreError):
        cq.append(5, pack(entries(500, 1)))
    with pytest.raises(StoreError):
        cq.append(2, b"x" * 21)
    cq.append(2, b"")
    assert cq.max_offset == 2
    cq.close()


def test_bad_names_are_rejected(tmp_path: Path) -> None:
    with pytest.raises(InvalidNameError):
        ConsumeQueue(str(tmp_path), "../x", 0)
    with pytest.raises(StoreError):
        ConsumeQueue(str(tmp_path), "t", -1)


def test_redispatch_overwrites_in_place(tmp_path: Path) -> None:
    cq = ConsumeQueue(str(tmp_path), "t", 0, entries_per_segment=8)
    cq.append(0, pack(entries(0, 12)))
    cq.append(4, pack(entries(400, 12)))  # overlaps the tail and extends it
    assert cq.max_offset == 16
    assert cq.get(0, 100) == entries(0, 4) + entries(400, 12)
    cq.close()


def test_fresh_queue_can_start_above_zero(tmp_path: Path) -> None:
    # Recovery rebuilding a lost queue dispatches its first record at its stored offset.
    cq = ConsumeQueue(str(tmp_path), "t", 0, entries_per_segment=8)
    cq.append(100, pack(entries(0, 3)))
    assert (cq.min_offset, cq.max_offset) == (100, 103)
    assert cq.get(99, 10) == []
    assert cq.get(100, 10) == entries(0, 3)
    cq.close()
    again = ConsumeQueue(str(tmp_path), "t", 0, entries_per_segment=8)
    assert (again.min_offset, again.max_offset) == (100, 103)
    again.close()


def test_truncate_from_phy(tmp_path: Path) -> None:
    cq = ConsumeQueue(str(tmp_path), "t", 0, entries_per_segment=8)
    cq.append(0, pack(entries(0, 30)))  # phy = 100 * i
    cq.truncate_from_phy(1050)  # entries 11.. point at or past it
    assert cq.max_offset == 11
    assert cq.get(0, 100) == entries(0, 11)
    assert seg_files(tmp_path) == [segment_name(0), segment_name(8)]
    cq.truncate_from_phy(10**9)  # nothing beyond: no change
    assert cq.max_offset == 11
    cq.close()
    again = ConsumeQueue(str(tmp_path), "t", 0, entries_per_segment=8)
    assert again.max_offset == 11
    assert again.get(0, 100) == entries(0, 11)
    again.append(11, pack(entries(1100, 2)))
    assert again.get(10, 5) == entries(0, 11)[10:] + entries(1100, 2)
    again.close()


def test_truncate_at_segment_boundary_and_to_nothing(tmp_path: Path) -> None:
    cq = ConsumeQueue(str(tmp_path), "t", 0, entries_per_segment=8)
    cq.append(0, pack(entries(0, 20)))
    cq.truncate_from_phy(1600)
    assert cq.max_offset == 16
    assert seg_files(tmp_path) == [segment_name(0), segment_name(8)]
    cq.append(16, pack(entries(1600, 1)))
    assert seg_files(tmp_path)[-1] == segment_name(16)
    cq.truncate_from_phy(0)
    assert (cq.min_offset, cq.max_offset) == (0, 0)
    assert cq.last_entry() is None
    assert seg_files(tmp_path) == [segment_name(0)]
    cq.close()
    again = ConsumeQueue(str(tmp_path), "t", 0, entries_per_segment=8)
    assert (again.min_offset, again.max_offset) == (0, 0)
    again.close()


def test_delete_below_phy(tmp_path: Path) -> None:
    cq = ConsumeQueue(str(tmp_path), "t", 0, entries_per_segment=8)
    cq.append(0, pack(entries(0, 30)))
    assert cq.delete_below_phy(1750) == 2  # segments [0,8) and [8,16) end below 1750
    assert cq.min_offset == 18
    assert cq.get(0, 5) == []
    assert cq.get(18, 2) == entries(0, 30)[18:20]
    assert seg_files(tmp_path) == [segment_name(16), segment_name(24)]
    assert cq.delete_below_phy(10**9) == 1  # the active segment is kept
    assert (cq.min_offset, cq.max_offset) == (30, 30)
    assert cq.last_entry() == entries(0, 30)[-1]
    cq.append(30, pack(entries(3000, 1)))
    assert cq.get(30, 5) == [(3000, 100, 1)]
    cq.close()
    again = ConsumeQueue(str(tmp_path), "t", 0, entries_per_segment=8)
    assert (again.min_offset, again.max_offset) == (24, 31)
    again.delete_below_phy(3000)
    assert again.min_offset == 30
    again.close()


def test_redispatch_below_deleted_segments_is_skipped(tmp_path: Path) -> None:
    cq = ConsumeQueue(str(tmp_path), "t", 0, entries_per_segment=8)
    cq.append(0, pack(entries(0, 20)))
    cq.delete_below_phy(1000)
    cq.append(4, pack(entries(400, 16)))
    assert cq.min_offset == 10
    assert cq.get(10, 100) == entries(400, 16)[6:]
    cq.close()


def test_many_segments_stay_readable_with_bounded_mappings(tmp_path: Path) -> None:
    cq = ConsumeQueue(str(tmp_path), "t", 0, entries_per_segment=4)
    all_entries = entries(0, 200)
    for i in range(0, 200, 10):
        cq.append(i, pack(all_entries[i : i + 10]))
    for start in range(0, 200, 3):
        assert cq.get(start, 7) == all_entries[start : start + 7]
    cq.flush()
    cq.close()


def test_consume_queues_table(tmp_path: Path) -> None:
    cqs = ConsumeQueues(str(tmp_path), entries_per_segment=8)
    assert cqs.find("a", 0) is None
    cqs.get_or_create("a", 0).append(0, pack(entries(0, 3)))
    cqs.get_or_create("a", 1).append(0, pack(entries(300, 2)))
    cqs.get_or_create("%RETRY%g", 0).append(0, pack(entries(500, 1)))
    assert cqs.max_last_phy() == 500
    cqs.flush()
    cqs.close()
    again = ConsumeQueues(str(tmp_path), entries_per_segment=8)
    assert sorted((q.topic, q.queue_id, q.max_offset) for q in again) == [
        ("%RETRY%g", 0, 1), ("a", 0, 3), ("a", 1, 2)]
    again.truncate_from_phy(350)
    assert [q.max_offset for q in (again.find("a", 0), again.find("a", 1))] == [3, 1]  # type: ignore[union-attr]
    assert again.delete_below_phy(10**6) == 0
    assert again.find("a", 0).min_offset == 3  # type: ignore[union-attr]
    again.close()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    eps=st.integers(1, 9),
    batches=st.lists(st.integers(1, 25), min_size=1, max_size=8),
    reads=st.lists(st.tuples(st.integers(0, 120), st.integers(1, 40)), max_size=10),
    cut=st.integers(0, 200),
)
def test_property_matches_a_list(tmp_path_factory: pytest.TempPathFactory, eps: int,
                                 batches: list[int], reads: list[tuple[int, int]], cut: int) -> None:
    root = str(tmp_path_factory.mktemp("cq"))
    model: list[tuple[int, int, int]] = []
    cq = ConsumeQueue(root, "p", 1, entries_per_segment=eps)
    for n in batches:
        new = entries(len(model) * 10, n, size=10)
        cq.append(len(model), pack(new))
        model.extend(new)
    for start, count in reads:
        assert cq.get(start, count) == model[start : start + count]
    cq.truncate_from_phy(cut * 10)
    model = [e for e in model if e[0] < cut * 10]
    cq.close()
    cq = ConsumeQueue(root, "p", 1, entries_per_segment=eps)
    assert (cq.min_offset, cq.max_offset) == (0, len(model))
    assert cq.get(0, 1000) == model
    cq.close()


def test_data_end_skips_the_sparse_tail(tmp_path: Path) -> None:
    from ferry.store.cq_segment import data_end as _data_end

    path = tmp_path / "f"
    with open(path, "wb") as f:
        f.truncate(1 << 20)
    assert _data_end(str(path), 1 << 20) in (0, 1 << 20)  # 1 MiB: no hole support is fine
    with open(path, "r+b") as f:
        f.seek(5000)
        f.write(b"x")
    end = _data_end(str(path), 1 << 20)
    assert 5001 <= end <= 1 << 20


def test_reopen_many_queues_is_cheap_and_right(tmp_path: Path) -> None:
    cqs = ConsumeQueues(str(tmp_path), entries_per_segment=300_000)
    for q in range(50):
        cqs.get_or_create("t", q).append(0, pack(entries(q * 1000, q + 1)))
    cqs.close()
    again = ConsumeQueues(str(tmp_path), entries_per_segment=300_000)
    assert [again.find("t", q).max_offset for q in range(50)] == [q + 1 for q in range(50)]  # type: ignore[union-attr]
    again.close()


_MANY_QUEUES_CHILD = r"""
import resource, sys
resource.setrlimit(resource.RLIMIT_NOFILE, (512, 512))
from ferry.store import MessageIn, MessageStore, StoreConfig
cfg = StoreConfig(root_dir=sys.argv[1], commitlog_segment_bytes=1 << 20,
                  max_message_bytes=16 * 1024, cq_entries_per_segment=64,
                  index_max_slots=1024, index_max_entries=8192, warm_ahead_bytes=0)
for round_ in range(2):  # the second round reopens all 2,000 queues
    with MessageStore(cfg) as s:
        for t in range(250):
            s.put_batch([MessageIn(f"t{t}", q, b"m%d" % round_) for q in range(8)])
        assert s.max_offset("t0", 0) == round_ + 1, s.max_offset("t0", 0)
        assert len(s.get_messages("t249", 7, 0).records) == round_ + 1
        assert s.failure is None
print("ok")
"""


def test_two_thousand_queues_fit_in_512_file_descriptors(tmp_path: Path) -> None:
    got = subprocess.run([sys.executable, "-c", _MANY_QUEUES_CHILD, str(tmp_path)],
                         capture_output=True, text=True, timeout=120)
    assert got.returncode == 0 and got.stdout.strip() == "ok", got.stderr[-2000:]


def test_mapping_lru_bounds_mapped_segments_and_keeps_dirty(tmp_path: Path) -> None:
    cqs = ConsumeQueues(str(tmp_path), entries_per_segment=8, max_mapped_segments=4)
    for q in range(10):
        cqs.get_or_create("t", q).append(0, CQ_ENTRY.pack(100 + q, 10, 0))
    assert len(cqs.lru) == 4
    assert len(cqs.take_dirty()) == 10  # unmapped ones still need their fdatasync
    assert [cqs.get_or_create("t", q).get(0, 1) for q in range(10)] == [
        [(100 + q, 10, 0)] for q in range(10)]
    assert len(cqs.lru) == 4
    cqs.close()


def test_segments_after_a_missing_one_are_dropped_on_load(tmp_path: Path) -> None:
    cq = ConsumeQueue(str(tmp_path), "t", 0, entries_per_segment=4)
    cq.append(0, b"".join(CQ_ENTRY.pack(100 * i, 10, 0) for i in range(1, 11)))  # 3 segments
    cq.close()
    qdir = tmp_path / "consumequeue" / "t" / "0"
    os.remove(qdir / segment_name(4))  # its directory entry was lost
    again = ConsumeQueue(str(tmp_path), "t", 0, entries_per_segment=4)
    assert (again.min_offset, again.max_offset) == (0, 4)
    assert sorted(os.listdir(qdir)) == [segment_name(0)]
    again.append(4, CQ_ENTRY.pack(500, 10, 0))  # recovery re-dispatches from there
    assert again.get(3, 2) == [(400, 10, 0), (500, 10, 0)]
    again.close()
