"""Bucket and journal files: round trip, torn tails, damaged entries."""
from __future__ import annotations

from pathlib import Path

import pytest
from ferry_delay_scheduler import wheel_files as wf


def _bucket(tmp_path: Path) -> str:
    return str(tmp_path / wf.file_name(7, wf.BUCKET_SUFFIX))


def test_round_trip(tmp_path: Path) -> None:
    path = _bucket(tmp_path)
    wf.append(path, wf.KIND_BUCKET, 420_000, wf.encode_bucket_entries([(1, 10), (2, 20)]))
    wf.append(path, wf.KIND_BUCKET, 420_000, wf.encode_bucket_entries([(3, 30)]))
    got = wf.read_entries(path, wf.KIND_BUCKET)
    assert [(d, p) for d, p, _ in got.entries] == [(1, 10), (2, 20), (3, 30)]
    assert got.bad_entries == 0
    assert Path(path).stat().st_size == wf.FILE_HEADER.size + 3 * wf.ENTRY_SIZE


def test_torn_tail_is_ignored_then_cut_before_the_next_append(tmp_path: Path) -> None:
    path = _bucket(tmp_path)
    wf.append(path, wf.KIND_BUCKET, 0, wf.encode_bucket_entries([(1, 10)]))
    with open(path, "ab") as f:  # a crash in the middle of the second entry
        f.write(wf.encode_entry(2, 20, 0)[:11])
    assert [(d, p) for d, p, _ in wf.read_entries(path, wf.KIND_BUCKET).entries] == [(1, 10)]
    wf.append(path, wf.KIND_BUCKET, 0, wf.encode_bucket_entries([(3, 30)]))
    got = wf.read_entries(path, wf.KIND_BUCKET)
    assert [(d, p) for d, p, _ in got.entries] == [(1, 10), (3, 30)]


def test_zeroed_or_damaged_entries_are_skipped_alone(tmp_path: Path) -> None:
    path = _bucket(tmp_path)
    wf.append(path, wf.KIND_BUCKET, 0, wf.encode_bucket_entries([(1, 10), (2, 20), (3, 30)]))
    with open(path, "r+b") as f:
        f.seek(wf.FILE_HEADER.size + wf.ENTRY_SIZE)  # the second entry: zeros, as after power loss
        f.write(bytes(wf.ENTRY_SIZE))
        f.seek(0, 2)
        f.write(bytes(wf.ENTRY_SIZE))  # and a zeroed entry at the end
    got = wf.read_entries(path, wf.KIND_BUCKET)
    assert [(d, p) for d, p, _ in got.entries] == [(1, 10), (3, 30)]
    assert got.bad_entries == 2


def test_a_file_shorter_than_its_header_gets_a_new_header(tmp_path: Path) -> None:
    path = _bucket(tmp_path)
    Path(path).write_bytes(b"FD")
    assert wf.read_entries(path, wf.KIND_BUCKET).entries == []
    wf.append(path, wf.KIND_BUCKET, 0, wf.encode_bucket_entries([(5, 50)]))
    assert [(d, p) for d, p, _ in wf.read_entries(path, wf.KIND_BUCKET).entries] == [(5, 50)]


def test_wrong_kind_is_refused(tmp_path: Path) -> None:
    path = _bucket(tmp_path)
    wf.append(path, wf.KIND_BUCKET, 0, b"")
    with pytest.raises(ValueError, match="wheel file"):
        wf.read_entries(path, wf.KIND_JOURNAL)


def test_names() -> None:
    assert wf.file_name(12, wf.JOURNAL_SUFFIX) == "000000000012.jnl"
    assert wf.parse_name("000000000012.jnl", wf.JOURNAL_SUFFIX) == 12
    assert wf.parse_name("12.jnl", wf.JOURNAL_SUFFIX) is None
    assert wf.parse_name("000000000012.bkt", wf.JOURNAL_SUFFIX) is None
