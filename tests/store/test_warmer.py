"""The page warmer: a hint thread that must never break appends, reads or close."""
from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest
from ferry.errors import StoreError
from ferry.store import (
    FlushMode,
    GetStatus,
    MessageIn,
    MessageStore,
    StoreConfig,
    decode_record,
)
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


@pytest.mark.parametrize("mode", [FlushMode.ASYNC, FlushMode.SYNC])
@pytest.mark.parametrize("ahead", [0, 64 * 1024])
def test_store_appends_and_reads_with_or_without_warming(tmp_path: Path, ahead: int,
                                                         mode: FlushMode) -> None:
    # SYNC warms by writing zeros ahead of the writer: never over a record, across rolls,
    # and the store reopens (recovers) to every record.
    cfg = StoreConfig(root_dir=str(tmp_path), commitlog_segment_bytes=256 * 1024,
                      max_message_bytes=16 * 1024, warm_ahead_bytes=ahead, flush_mode=mode)
    want = [i for i in range(40) for _ in range(5)]
    with MessageStore(cfg) as s:
        for i in range(40):  # several segments
            s.put_batch([MessageIn("w", 0, bytes([i]) * 4000) for _ in range(5)])
            if mode is FlushMode.SYNC and i % 8 == 0:
                time.sleep(0.01)  # let the warmer run ahead and fall behind in turn
        got = s.get_messages("w", 0, 0, max_count=500, max_bytes=10 << 20)
        assert got.status is GetStatus.FOUND and len(got.records) == 200
        assert [decode_record(r).body[0] for r in got.records] == want
    with MessageStore(cfg) as s:
        got = s.get_messages("w", 0, 0, max_count=500, max_bytes=10 << 20)
        assert [decode_record(r).body[0] for r in got.records] == want


def test_zeroing_writes_zeros_ahead_and_a_writer_waits_for_its_claim(tmp_path: Path) -> None:
    path = tmp_path / segment_name(0)
    path.write_bytes(b"\xff" * SEG)  # a full segment, so that the zeros written ahead show
    warmer = PageWarmer(str(tmp_path), SEG, ahead_bytes=256 * 1024, write_offset=200 * 1024,
                        zero=True)
    warmer.start()  # zeroes [200 KiB, 456 KiB) at once
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and path.read_bytes()[400 * 1024] != 0:
        time.sleep(0.01)
    data = path.read_bytes()
    assert data[400 * 1024] == 0 and data[:200 * 1024] == b"\xff" * (200 * 1024)
    # A claim below the writer's end holds the writer until it clears (set once the
    # warmer has finished its own step and waits for a kick).
    while warmer._claim_lo != 1 << 62 and time.monotonic() < deadline:
        time.sleep(0.01)
    with warmer._cond:
        warmer._claim_lo = 500 * 1024
    released: list[float] = []

    def write() -> None:
        warmer.before_write(600 * 1024)
        released.append(time.monotonic())

    t = threading.Thread(target=write)
    t.start()
    time.sleep(0.05)
    assert not released
    cleared = time.monotonic()
    with warmer._cond:
        warmer._claim_lo = 1 << 62
        warmer._cond.notify_all()
    t.join(5)
    assert released and released[0] >= cleared
    # ... and the warmer never zeroes below an end the writer announced.
    warmer.wrote_to(700 * 1024)
    warmer.stop()
    data = path.read_bytes()
    assert data[:200 * 1024] == b"\xff" * (200 * 1024)


def test_negative_warm_ahead_is_refused(tmp_path: Path) -> None:
    with pytest.raises(StoreError):
        StoreConfig(root_dir=str(tmp_path), warm_ahead_bytes=-1)
