"""ferry.atomic_file: a state file is replaced whole, never left half written."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
from ferry.atomic_file import load_versioned, replace_durably


def test_replace_writes_everything_and_leaves_no_temp_file(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    replace_durably(path, b"old")
    big = os.urandom(5 << 20)  # larger than one write may take
    replace_durably(path, big)
    assert path.read_bytes() == big
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json"]


def test_a_stale_temp_file_from_a_crash_is_overwritten(tmp_path: Path) -> None:
    path = tmp_path / "progress.json"
    (tmp_path / "progress.json.tmp").write_bytes(b"half written garbage" * 1000)
    replace_durably(path, b"{}")
    assert path.read_bytes() == b"{}"
    assert not (tmp_path / "progress.json.tmp").exists()


def test_a_versioned_file_loads_back_and_a_missing_one_is_none(tmp_path: Path) -> None:
    path = tmp_path / "progress.json"
    assert load_versioned(path, 1, "remove it") is None
    replace_durably(path, b'{"version": 1, "at": 5}')
    assert load_versioned(path, 1, "remove it") == {"version": 1, "at": 5}


@pytest.mark.parametrize(("payload", "error"), [
    (b"{not json", "is not valid JSON .*; remove it"),
    (b'{"version": 2}', "has version 2, expected 1"),
    (b"[1]", "has version None, expected 1"),
])
def test_a_bad_versioned_file_names_itself_and_the_remedy(tmp_path: Path, payload: bytes,
                                                          error: str) -> None:
    path = tmp_path / "checkpoint.json"
    path.write_bytes(payload)
    with pytest.raises(ValueError, match=error):
        load_versioned(path, 1, "remove it")
