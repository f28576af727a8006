"""Cold reads: which commit-log spans a read needs that are not in the page cache, and
reading them in (off the serving thread) so that the read itself never waits on disk."""
from __future__ import annotations

import os
from pathlib import Path

from ferry.store import GetStatus, MessageIn, MessageStore, StoreConfig
from ferry.store.reader import load_spans

SEG = 256 * 1024


def _store(tmp_path: Path) -> MessageStore:
    return MessageStore(StoreConfig(root_dir=str(tmp_path), commitlog_segment_bytes=SEG,
                                    max_message_bytes=16 * 1024, warm_ahead_bytes=0))


def _evict(root: Path) -> None:
    """Write the commit log back and ask the kernel to drop its pages (only a request:
    the kernel keeps pages that are mapped or dirty)."""
    for seg in (root / "commitlog").iterdir():
        fd = os.open(seg, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def test_cold_spans_are_bounded_by_the_read_and_gone_once_loaded(tmp_path: Path) -> None:
    with _store(tmp_path) as s:
        for i in range(30):  # several segments
            s.put_batch([MessageIn("c", 0, bytes([i]) * 4000) for _ in range(10)])
    _evict(tmp_path)   # closed first: the kernel keeps pages that a mapping holds
    with _store(tmp_path) as s:
        spans = s.cold_spans("c", 0, 0, max_count=100, max_bytes=64 * 1024)
        assert spans   # the first segment: recovery reads only the log's tail
        assert sum(length for _, _, length in spans) <= 64 * 1024 + 8192
        for path, rel, length in spans:
            assert os.path.exists(path) and 0 <= rel and rel + length <= SEG
        load_spans(spans)
        assert s.cold_spans("c", 0, 0, max_count=100, max_bytes=64 * 1024) == []
        got = s.get_messages("c", 0, 0, max_count=100, max_bytes=64 * 1024)
        assert got.status is GetStatus.FOUND and len(got.records) >= 10


def test_cold_spans_of_a_read_bounded_by_count_end_at_its_last_record(tmp_path: Path) -> None:
    with _store(tmp_path) as s:
        for i in range(30):
            s.put_batch([MessageIn("c", 0, bytes([i]) * 4000) for _ in range(10)])
    _evict(tmp_path)
    with _store(tmp_path) as s:
        spans = s.cold_spans("c", 0, 0, max_count=10, max_bytes=1 << 20)
        load_spans(spans)
        got = s.get_messages("c", 0, 0, max_count=10, max_bytes=1 << 20)
        assert got.status is GetStatus.FOUND and len(got.records) == 10
        # the ten records, back to back in the first segment: exactly their bytes
        assert [(rel, length) for _, rel, length in spans] == [
            (0, sum(len(r) for r in got.records))]


def test_nothing_is_cold_outside_the_queue_or_after_a_write(tmp_path: Path) -> None:
    with _store(tmp_path) as s:
        s.put_batch([MessageIn("c", 0, b"x" * 3000) for _ in range(20)])
        assert s.cold_spans("c", 0, 0, max_count=20) == []        # just written: cached
        assert s.cold_spans("c", 0, 20) == []                     # at the end: nothing to read
        assert s.cold_spans("c", 1, 0) == [] and s.cold_spans("nope", 0, 0) == []


def test_loading_a_deleted_segment_is_only_a_lost_hint(tmp_path: Path) -> None:
    load_spans([(str(tmp_path / "gone"), 0, 4096)])
