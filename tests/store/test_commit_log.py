"""Commit log: append, roll-over with blank markers, reads, flush, truncate, reopen."""
from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from ferry.codec.record import BLANK, BLANK_MAGIC, HEADER_SIZE, decode_record
from ferry.errors import StoreError
from ferry.store.commit_log import CommitLog

from tests.store.log_writer import LogWriter

SEG = 4096


def _log(tmp_path: Path) -> tuple[CommitLog, LogWriter]:
    cl = CommitLog(str(tmp_path), SEG)
    cl.set_positions(0)
    return cl, LogWriter(str(tmp_path), cl)


def test_append_read_and_roll(tmp_path: Path) -> None:
    cl, w = _log(tmp_path)
    phys: list[int] = []
    for i in range(40):
        phys += w.append([bytes([i]) * 300])
    segs = cl.segments
    assert len(segs) > 3
    for seg in segs:
        assert os.path.basename(seg.path) == f"{seg.start_offset:020d}"
        assert os.path.getsize(seg.path) == SEG
    for i, phy in enumerate(phys):
        size = HEADER_SIZE + 1 + 300
        # never straddles: the record and 8 spare bytes fit in its segment
        assert phy // SEG == (phy + size + 8 - 1) // SEG
        raw = cl.read(phy, size)
        assert raw is not None
        msg = decode_record(raw)
        assert (msg.queue_offset, msg.body, msg.phy_offset) == (i, bytes([i]) * 300, phy)
    # the first segment ends with a blank marker filling it
    first_end = phys[1] + HEADER_SIZE + 301
    while first_end + HEADER_SIZE + 301 + 8 <= SEG:
        first_end += HEADER_SIZE + 301
    size, magic = BLANK.unpack_from(segs[0].view, first_end)
    assert (magic, first_end + size) == (BLANK_MAGIC, SEG)
    assert cl.read(phys[-1], 10_000) is None
    assert cl.read(cl.write_offset, 10) is None
    assert cl.flush() == cl.write_offset == cl.flushed_offset
    cl.close()


def test_batch_spanning_segments_and_truncate(tmp_path: Path) -> None:
    cl, w = _log(tmp_path)
    phys = w.append([b"x" * 500] * 20)
    assert len({p // SEG for p in phys}) >= 3
    cut = phys[10]
    end = cl.write_offset
    cl.truncate(cut)
    cl.set_positions(cut)
    assert cl.segments[-1].start_offset == cut - cut % SEG
    assert cl.read(cut, 10) is None
    assert bytes(cl.segments[-1].view[cut % SEG:]) == bytes(SEG - cut % SEG)
    assert end > cl.write_offset
    new = w.append([b"y" * 10])
    assert new == [cut]
    cl.close()


def test_reopen_and_bad_files(tmp_path: Path) -> None:
    cl, w = _log(tmp_path)
    w.append([b"x" * 1000] * 10)
    cl.close()
    cl = CommitLog(str(tmp_path), SEG)
    assert len(cl.segments) >= 3
    cl.close()
    os.truncate(tmp_path / "commitlog" / f"{0:020d}", 100)
    with pytest.raises(StoreError):
        CommitLog(str(tmp_path), SEG)


def test_delete_segments_keeps_active(tmp_path: Path) -> None:
    cl, w = _log(tmp_path)
    w.append([b"x" * 1000] * 10)
    starts = {s.start_offset for s in cl.segments}
    assert cl.delete_segments(starts) == len(starts) - 1
    assert len(cl.segments) == 1 and cl.min_offset == max(starts)
    cl.close()


def test_a_roll_does_not_wait_behind_a_flush(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import threading

    from ferry.store import commit_log as commit_log_mod
    cl = CommitLog(str(tmp_path), 64 * 1024)
    cl.set_positions(0)
    cl.advance(100)
    syncing, release = threading.Event(), threading.Event()
    real = os.fdatasync

    def slow_fdatasync(fd: int) -> None:
        syncing.set()
        release.wait(5)
        real(fd)
    monkeypatch.setattr(commit_log_mod.os, "fdatasync", slow_fdatasync)
    flusher = threading.Thread(target=cl.flush)
    flusher.start()
    assert syncing.wait(5)
    t0 = time.monotonic()
    nxt = cl.roll(cl.active(), 100)  # needs the segment list while the disk is "stuck"
    assert time.monotonic() - t0 < 1 and nxt.start_offset == 64 * 1024
    release.set()
    flusher.join()
    assert cl.flushed_offset == 100
    cl.close()
