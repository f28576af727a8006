"""The page warmer: a hint thread that must never break appends, reads or close."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
from ferry.errors import StoreError
from ferry.store import GetStatus, MessageIn, MessageStore, StoreConfig, decode_record
from ferry.store.mapped_file import segment_name
from ferry.store.warmer import PageWarmer

SEG = 1 << 20


def test_warms_existing_segments_and_skips_missing_ones(tmp_path: Path) -> None:
    with open(tmp_path / segment_name(0), "wb") as f:
        f.truncate(SEG)
    warmer = PageWarmer(str(tmp_path), SEG, ahead_bytes=256 * 1024, write_offset=0)
    warmer.start()
    for pos in range(0, 3 * SEG, 64 * 1024):  # runs past the only segment into missing ones
        warmer.wrote_to(pos)
    warmer.stop()
    assert not warmer._thread.is_alive()
    assert os.path.getsize(tmp_path / segment_name(0)) == SEG  # only read, never written


@pytest.mark.parametrize("ahead", [0, 64 * 1024])
def test_store_appends_and_reads_with_or_without_warming(tmp_path: Path, ahead: int) -> None:
    cfg = StoreConfig(root_dir=str(tmp_path), commitlog_segment_bytes=256 * 1024,
                      max_message_bytes=16 * 1024, warm_ahead_bytes=ahead)
    with MessageStore(cfg) as s:
        for i in range(40):  # several segments
            s.put_batch([MessageIn("w", 0, bytes([i]) * 4000) for _ in range(5)])
        got = s.get_messages("w", 0, 0, max_count=500, max_bytes=10 << 20)
        assert got.status is GetStatus.FOUND and len(got.records) == 200
        assert [decode_record(r).body[0] for r in got.records] == [i for i in range(40)
                                                                   for _ in range(5)]


def test_negative_warm_ahead_is_refused(tmp_path: Path) -> None:
    with pytest.raises(StoreError):
        StoreConfig(root_dir=str(tmp_path), warm_ahead_bytes=-1)
