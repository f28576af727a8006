"""Index files: chains, collisions, roll-over, time windows, recovery and retention."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
from ferry.errors import StoreError
from ferry.store.index_file import INDEX_ENTRY, INDEX_HEADER, INDEX_SLOT, IndexService
from ferry.store.index_keys import key_hash
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

T0 = 1_700_000_000_000


def files(root: Path) -> list[str]:
    return sorted(os.listdir(root / "index"))


def put(svc: IndexService, items: list[tuple[bytes, int, int]]) -> None:
    """Index (key, phy, store ts) items as the store does: keys hashed by key_hash."""
    svc.put_hashed([(key_hash(k), phy, ts) for k, phy, ts in items])


def test_struct_sizes() -> None:
    assert (INDEX_HEADER.size, INDEX_SLOT.size, INDEX_ENTRY.size) == (64, 4, 20)


def test_key_hash_is_stable() -> None:
    assert key_hash(b"abc") == 910901175  # CRC32C, the same in every process


def test_empty_service(tmp_path: Path) -> None:
    svc = IndexService(str(tmp_path), max_slots=8, max_entries=16)
    assert svc.last_phy_offset == -1
    assert svc.query(b"k", 0, 2**62, 10) == []
    assert svc.truncate_from_phy(0) == 0
    assert svc.delete_below_phy(100) == 0
    svc.close()


def test_put_query_newest_first(tmp_path: Path) -> None:
    svc = IndexService(str(tmp_path), max_slots=64, max_entries=1000)
    put(svc, [(b"a", 0, T0), (b"b", 0, T0), (b"a", 100, T0 + 1), (b"c", 200, T0 + 2)])
    put(svc, [(b"a", 300, T0 + 3)])
    assert svc.query(b"a", 0, 2**62, 10) == [300, 100, 0]
    assert svc.query(b"a", 0, 2**62, 2) == [300, 100]
    assert svc.query(b"b", 0, 2**62, 10) == [0]
    assert svc.query(b"zz", 0, 2**62, 10) == []
    assert svc.last_phy_offset == 300
    svc.close()


def test_collisions_in_a_single_slot(tmp_path: Path) -> None:
    # One slot: every key shares one chain; the hash check separates them.
    svc = IndexService(str(tmp_path), max_slots=1, max_entries=1000)
    put(svc, [(f"k{i % 10}".encode(), i * 10, T0 + i) for i in range(200)])
    for k in range(10):
        want = [i * 10 for i in reversed(range(200)) if i % 10 == k]
        assert svc.query(f"k{k}".encode(), 0, 2**62, 1000) == want
    svc.close()


def test_same_message_with_colliding_keys_is_reported_once(tmp_path: Path) -> None:
    svc = IndexService(str(tmp_path), max_slots=4, max_entries=100)
    put(svc, [(b"x", 500, T0), (b"x", 500, T0)])  # duplicate keys of one record
    assert svc.query(b"x", 0, 2**62, 10) == [500]
    svc.close()


def test_time_window(tmp_path: Path) -> None:
    svc = IndexService(str(tmp_path), max_slots=16, max_entries=1000)
    put(svc, [(b"k", i * 10, T0 + i * 1000) for i in range(10)])
    assert svc.query(b"k", T0 + 2000, T0 + 4000, 10) == [40, 30, 20]
    assert svc.query(b"k", T0 + 2001, T0 + 3999, 10) == [30]
    assert svc.query(b"k", T0 + 20_000, T0 + 30_000, 10) == []
    assert svc.query(b"k", 0, T0 - 1, 10) == []
    svc.close()


def test_roll_over_by_entry_count_and_reopen(tmp_path: Path) -> None:
    svc = IndexService(str(tmp_path), max_slots=4, max_entries=10)
    items = [(f"key{i % 7}".encode(), i * 10, T0 + i) for i in range(95)]
    put(svc, items[:50])
    for it in items[50:]:
        put(svc, [it])
    assert len(files(tmp_path)) == 10
    names = files(tmp_path)
    assert names == sorted(set(names)) and names[0] == f"{T0:020d}"
    svc.close()
    again = IndexService(str(tmp_path), max_slots=4, max_entries=10)
    for k in range(7):
        want = [i * 10 for i in reversed(range(95)) if i % 7 == k]
        assert again.query(f"key{k}".encode(), 0, 2**62, 1000) == want
        assert again.query(f"key{k}".encode(), T0 + 20, T0 + 29, 1000) == [
            i * 10 for i in reversed(range(20, 30)) if i % 7 == k]
    assert again.last_phy_offset == 940
    again.close()


def test_roll_over_when_time_delta_overflows(tmp_path: Path) -> None:
    svc = IndexService(str(tmp_path), max_slots=4, max_entries=100)
    day_ms = 86_400_000
    put(svc, [(b"k", 0, T0), (b"k", 10, T0 + 20 * day_ms), (b"k", 20, T0 + 30 * day_ms),
                  (b"k", 30, T0 + 30 * day_ms - 40 * day_ms)])  # a clock that went back
    assert len(files(tmp_path)) == 3
    assert svc.query(b"k", 0, 2**62, 10) == [30, 20, 10, 0]
    assert svc.query(b"k", T0 + 25 * day_ms, 2**62, 10) == [20]
    svc.close()


def test_skips_already_indexed_phys(tmp_path: Path) -> None:
    svc = IndexService(str(tmp_path), max_slots=16, max_entries=100)
    put(svc, [(b"a", 0, T0), (b"b", 100, T0)])
    put(svc, [(b"a", 0, T0), (b"b", 100, T0), (b"c", 200, T0)])  # a re-dispatch
    assert svc.query(b"b", 0, 2**62, 10) == [100]
    assert svc.query(b"c", 0, 2**62, 10) == [200]
    svc.close()


def test_truncate_from_phy(tmp_path: Path) -> None:
    svc = IndexService(str(tmp_path), max_slots=2, max_entries=10)
    items = []
    for i in range(40):  # 40 records with two keys each, 100 bytes apart
        items += [(f"id{i}".encode(), i * 100, T0 + i), (f"k{i % 3}".encode(), i * 100, T0 + i)]
    put(svc, items)
    assert len(files(tmp_path)) == 8
    # Everything from 2550 on goes, and the newest remaining record (2500) too.
    assert svc.truncate_from_phy(2550) == 2500
    assert svc.last_phy_offset == 2400
    assert len(files(tmp_path)) == 5
    assert svc.query(b"id25", 0, 2**62, 10) == []
    assert svc.query(b"id24", 0, 2**62, 10) == [2400]
    assert svc.query(b"k0", 0, 2**62, 100) == [i * 100 for i in reversed(range(25)) if i % 3 == 0]
    svc.close()
    again = IndexService(str(tmp_path), max_slots=2, max_entries=10)
    put(again, items[50:])  # re-dispatch from the returned offset
    assert again.query(b"k1", 0, 2**62, 100) == [i * 100 for i in reversed(range(40)) if i % 3 == 1]
    assert again.query(b"id39", 0, 2**62, 100) == [3900]
    assert again.truncate_from_phy(0) == 0
    assert files(tmp_path) == [] and again.last_phy_offset == -1
    again.close()


def test_reopen_after_crash_before_header_update(tmp_path: Path) -> None:
    svc = IndexService(str(tmp_path), max_slots=8, max_entries=100)
    put(svc, [(b"a", 0, T0), (b"b", 100, T0 + 5)])
    path = tmp_path / "index" / files(tmp_path)[0]
    svc.close()
    with open(path, "r+b") as f:  # the header still says one entry
        f.seek(56)
        f.write((1).to_bytes(4, "little"))
    again = IndexService(str(tmp_path), max_slots=8, max_entries=100)
    assert again.last_phy_offset == 100
    assert again.query(b"b", T0 + 5, T0 + 5, 10) == [100]
    again.close()


def test_torn_newest_file_is_dropped_older_is_an_error(tmp_path: Path) -> None:
    svc = IndexService(str(tmp_path), max_slots=2, max_entries=2)
    put(svc, [(b"a", i, T0 + i) for i in range(6)])
    svc.close()
    names = files(tmp_path)
    (tmp_path / "index" / (names[-1] + ".tmp")).write_bytes(b"partial")
    (tmp_path / "index" / names[-1]).write_bytes(b"garbage")
    again = IndexService(str(tmp_path), max_slots=2, max_entries=2)
    assert files(tmp_path) == names[:-1]
    assert again.last_phy_offset == 3
    again.close()
    (tmp_path / "index" / names[0]).write_bytes(b"garbage")
    with pytest.raises(StoreError):
        IndexService(str(tmp_path), max_slots=2, max_entries=2)


def test_delete_below_phy_keeps_newest(tmp_path: Path) -> None:
    svc = IndexService(str(tmp_path), max_slots=4, max_entries=10)
    put(svc, [(b"k", i * 10, T0 + i) for i in range(35)])
    assert len(files(tmp_path)) == 4
    assert svc.delete_below_phy(195) == 2  # files ending at phy 90 and 190
    assert svc.delete_below_phy(195) == 0
    assert svc.query(b"k", 0, 2**62, 100) == [i * 10 for i in reversed(range(20, 35))]
    assert svc.delete_below_phy(10**9) == 1  # the newest file stays
    assert len(files(tmp_path)) == 1
    assert svc.query(b"k", 0, 2**62, 100) == [i * 10 for i in reversed(range(30, 35))]
    svc.close()


def test_bad_sizes_are_rejected(tmp_path: Path) -> None:
    with pytest.raises(StoreError):
        IndexService(str(tmp_path), max_slots=0)


def test_many_keys(tmp_path: Path) -> None:
    svc = IndexService(str(tmp_path), max_slots=1000, max_entries=5000)
    n = 20_000
    put(svc, [(b"I" + i.to_bytes(16, "big"), i * 64, T0 + i // 10) for i in range(n)])
    assert len(files(tmp_path)) == 4
    for i in range(0, n, 397):
        assert i * 64 in svc.query(b"I" + i.to_bytes(16, "big"), 0, 2**62, 10)
    svc.close()


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    slots=st.integers(1, 5), cap=st.integers(1, 12),
    keys=st.lists(st.lists(st.sampled_from([b"a", b"b", b"c", b"dd"]), min_size=1, max_size=3),
                  min_size=1, max_size=40),
    cut=st.integers(0, 45),
)
def test_property_matches_a_model(tmp_path_factory: pytest.TempPathFactory, slots: int, cap: int,
                                  keys: list[list[bytes]], cut: int) -> None:
    root = str(tmp_path_factory.mktemp("idx"))
    svc = IndexService(root, max_slots=slots, max_entries=cap)
    items = [(k, i * 10, T0 + i) for i, ks in enumerate(keys) for k in ks]
    put(svc, items)
    resume = svc.truncate_from_phy(cut * 10)
    kept = [it for it in items if it[1] < resume]
    svc.close()
    svc = IndexService(root, max_slots=slots, max_entries=cap)
    put(svc, [it for it in items if it[1] >= resume])
    for k in (b"a", b"b", b"c", b"dd"):
        want = sorted({p for kk, p, _ in items if kk == k}, reverse=True)
        assert svc.query(k, 0, 2**62, 1000) == want
    assert kept == [it for it in items if it[1] < resume]
    svc.close()


def test_entries_after_the_last_flush_survive_a_crash(tmp_path: Path) -> None:
    # The header is written on flush; a process killed after puts leaves entries
    # (in the page cache) past the header's count. Reopen takes them back.
    svc = IndexService(str(tmp_path), max_slots=8, max_entries=100)
    put(svc, [(b"a", 0, T0)])
    svc.flush()
    put(svc, [(b"b", 100, T0 + 7), (b"a", 200, T0 + 9)])
    seen = IndexService(str(tmp_path), max_slots=8, max_entries=100)  # no close: a crash
    assert seen.last_phy_offset == 200
    assert seen.query(b"a", 0, 2**62, 10) == [200, 0]
    assert seen.query(b"b", T0 + 7, T0 + 7, 10) == [100]
    assert seen.query(b"a", T0 + 9, T0 + 9, 10) == [200]
    seen.close()
    svc.close()


def test_chain_walk_is_capped_and_stops_before_the_window(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ferry.store import index_file
    svc = IndexService(str(tmp_path), max_slots=1, max_entries=1000)
    put(svc, [(b"k", i * 10, T0 + i) for i in range(100)])
    assert svc.query(b"k", T0 + 95, 2**62, 1000) == [990, 980, 970, 960, 950]
    monkeypatch.setattr(index_file, "MAX_CHAIN_STEPS", 7)
    assert len(svc.query(b"k", 0, 2**62, 1000)) == 7
    svc.close()


def test_a_put_failing_part_way_applies_exactly_the_rest_on_retry(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    svc = IndexService(str(tmp_path), max_slots=16, max_entries=4)
    items = [(key_hash(k), phy, T0) for k, phy in
             [(b"a", 10), (b"b", 20), (b"c", 30), (b"d1", 40), (b"d2", 40), (b"e", 50)]]
    real_roll = IndexService._roll
    calls = []

    def failing_roll(self: IndexService, ts_ms: int) -> object:
        calls.append(ts_ms)
        if len(calls) == 2:  # the roll after the first file filled up
            raise OSError(28, "No space left on device")
        return real_roll(self, ts_ms)
    monkeypatch.setattr(IndexService, "_roll", failing_roll)
    with pytest.raises(OSError):
        svc.put_hashed(items)
    assert [phy for _, phy, _ in items] == [40, 50]  # what is left to apply
    svc.put_hashed(items)
    for key, phy in [(b"a", 10), (b"d1", 40), (b"d2", 40), (b"e", 50)]:
        assert svc.query(key, 0, 2**62, 10) == [phy]
    svc.close()
