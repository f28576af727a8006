"""The checkpoint file: atomic round trip, damage detection."""
from __future__ import annotations

from pathlib import Path

from ferry.store.checkpoint import CHECKPOINT, Checkpoint, read_checkpoint, write_checkpoint


def test_round_trip_and_replace(tmp_path: Path) -> None:
    assert read_checkpoint(str(tmp_path)) is None
    write_checkpoint(str(tmp_path), Checkpoint(100, 90, False, 5))
    assert read_checkpoint(str(tmp_path)) == Checkpoint(100, 90, False, 5)
    write_checkpoint(str(tmp_path), Checkpoint(200, 200, True, 6))
    assert read_checkpoint(str(tmp_path)) == Checkpoint(200, 200, True, 6)
    assert (tmp_path / "checkpoint").stat().st_size == CHECKPOINT.size == 40
    assert not (tmp_path / "checkpoint.tmp").exists()


def test_damaged_checkpoint_is_ignored(tmp_path: Path) -> None:
    write_checkpoint(str(tmp_path), Checkpoint(100, 90, True, 5))
    path = tmp_path / "checkpoint"
    data = bytearray(path.read_bytes())
    for i in range(len(data)):
        flipped = bytearray(data)
        flipped[i] ^= 0x10
        path.write_bytes(bytes(flipped))
        assert read_checkpoint(str(tmp_path)) is None, i
    path.write_bytes(bytes(data[:-1]))
    assert read_checkpoint(str(tmp_path)) is None
