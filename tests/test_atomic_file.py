"""ferry.atomic_file: a state file is replaced whole, never left half written."""
from __future__ import annotations

import os
from pathlib import Path

from ferry.atomic_file import replace_durably


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
