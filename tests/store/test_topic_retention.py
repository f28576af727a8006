"""Per-topic retention over the shared commit log, with a clock the test controls (`now_ms`)."""
from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from ferry.errors import StoreError
from ferry.store import GetStatus, MessageIn, MessageStore, StoreConfig, TopicRetention
from ferry.store.retention import plan_retention

from tests.store.test_retention import HOUR_MS, NOW, SEG, segs

BODY = 12_000
STORE = dict(commitlog_segment_bytes=256 * 1024, max_message_bytes=16 * 1024,
             cq_entries_per_segment=8, index_max_slots=1024, index_max_entries=4096,
             retention_hours=72, disk_usage_fn=lambda _root: 0.1)
SHORT = {"short": TopicRetention(retention_ms=HOUR_MS)}  # 1 h, the broker's default is 72 h


def _open(root: Path) -> MessageStore:
    return MessageStore(StoreConfig(root_dir=str(root), **STORE))  # type: ignore[arg-type]


def _age_all_segments(store: MessageStore, hours: float) -> int:
    """Set every commit-log segment's modification time `hours` back; returns 'now' (ms)."""
    now = int(time.time() * 1000)
    for seg in store._cl.segments:
        old = (now - hours * HOUR_MS) / 1000
        os.utime(seg.path, (old, old))
    return now


def _put(store: MessageStore, topic: str, n: int) -> None:
    for i in range(n):
        store.put(MessageIn(topic, 0, b"x" * BODY, keys=f"{topic}-{i}"))


def _interleaved(store: MessageStore, n: int) -> None:
    for _ in range(n):
        _put(store, "short", 1)
        _put(store, "keep", 1)


def test_short_topic_drops_old_entries_default_topic_keeps_them(tmp_path: Path) -> None:
    with _open(tmp_path) as s:
        _interleaved(s, 60)  # about 6 segments holding both topics
        assert len(s._cl.segments) >= 5
        now = _age_all_segments(s, 2)  # 2 h old: past the short topic's 1 h, not 72 h
        # Half an hour old (the clock 1.5 h earlier): within the hour, nothing moves.
        s.run_retention(now_ms=now - int(1.5 * HOUR_MS), topics=SHORT)
        assert s.min_offset("short", 0) == 0 and s.min_offset("keep", 0) == 0
        s.run_retention(now_ms=now, topics=SHORT)
        low = s.min_offset("short", 0)
        assert 0 < low < s.max_offset("short", 0)  # the active segment's records stay
        assert s.get_messages("short", 0, 0).status is GetStatus.OFFSET_TOO_SMALL
        assert s.get_messages("short", 0, low).status is GetStatus.FOUND
        # The default topic keeps everything, and so does the shared log it still holds.
        assert s.min_offset("keep", 0) == 0 and s.commit_log_min_offset == 0
        assert all(s.get_messages("keep", 0, i, 1).status is GetStatus.FOUND for i in range(60))
    with _open(tmp_path) as s:  # the trimmed minimum survives a reopen
        assert s.min_offset("short", 0) == low
        assert s.get_messages("short", 0, 0).status is GetStatus.OFFSET_TOO_SMALL
        # Past the broker default, the shared segments go for every topic.
        report = s.run_retention(now_ms=int(time.time() * 1000) + 73 * HOUR_MS, topics=SHORT)
        assert report.deleted_segments >= 4
        assert s.min_offset("keep", 0) > 0 and s.commit_log_min_offset > 0


def test_segments_only_a_short_topic_holds_are_deleted_at_its_retention(tmp_path: Path) -> None:
    with _open(tmp_path) as s:
        _put(s, "short", 60)  # the oldest segments hold only the short topic
        _put(s, "keep", 60)
        now = _age_all_segments(s, 2)
        report = s.run_retention(now_ms=now, topics=SHORT)
        assert report.deleted_segments >= 2 and s.commit_log_min_offset > 0
        assert s.min_offset("short", 0) == s.max_offset("short", 0) == 60
        assert [s.get_messages("keep", 0, i, 1).status for i in range(60)] == \
            [GetStatus.FOUND] * 60
        # Without per-topic retention, 2 h old segments stay (72 h default).
    with _open(tmp_path / "other") as s:
        _put(s, "short", 60)
        _put(s, "keep", 60)
        assert s.run_retention(now_ms=_age_all_segments(s, 2)).deleted_segments == 0


def test_a_longer_topic_retention_holds_shared_segments(tmp_path: Path) -> None:
    long = {"long": TopicRetention(retention_ms=100 * HOUR_MS)}
    with _open(tmp_path) as s:
        for _ in range(60):
            _put(s, "long", 1)
            _put(s, "keep", 1)
        now = _age_all_segments(s, 80)  # past the default 72 h, within the topic's 100 h
        assert s.run_retention(now_ms=now, topics=long).deleted_segments == 0
        assert s.min_offset("long", 0) == 0
        assert s.run_retention(now_ms=now).deleted_segments >= 4  # no override: they go
    with _open(tmp_path / "b") as s:
        _put(s, "keep", 60)  # segments that only default topics hold go at 72 h
        _put(s, "long", 60)
        report = s.run_retention(now_ms=_age_all_segments(s, 80), topics=long)
        assert report.deleted_segments >= 2 and s.min_offset("long", 0) == 0


def test_size_retention_per_queue(tmp_path: Path) -> None:
    sized = {"small": TopicRetention(retention_bytes=50_000)}
    with _open(tmp_path) as s:
        for _ in range(30):
            s.put(MessageIn("small", 0, b"x" * BODY))
            s.put(MessageIn("small", 1, b"x" * BODY))
            _put(s, "keep", 1)
        s.run_retention(now_ms=int(time.time() * 1000), topics=sized)
        for qid in (0, 1):  # four records of about 12.1 kB fit in 50 kB, five do not
            assert s.max_offset("small", qid) - s.min_offset("small", qid) == 4
        assert s.min_offset("keep", 0) == 0
        s.run_retention(now_ms=int(time.time() * 1000),
                        topics={"small": TopicRetention(retention_bytes=10**9)})
        assert s.max_offset("small", 0) - s.min_offset("small", 0) == 4  # gone is gone


def test_every_entry_expired_keeps_the_queue_end_across_reopen(tmp_path: Path) -> None:
    with _open(tmp_path) as s:
        _put(s, "short", 3)
        _put(s, "keep", 60)  # rolls: the short topic's records are in a closed segment
        s.run_retention(now_ms=_age_all_segments(s, 2), topics=SHORT)
        assert s.min_offset("short", 0) == s.max_offset("short", 0) == 3
    with _open(tmp_path) as s:
        assert s.max_offset("short", 0) == 3  # offsets are never reused
        assert s.put(MessageIn("short", 0, b"new")).queue_offset == 3


def test_segment_retention_in_the_plan() -> None:
    # Segment 1 is held by a topic keeping 100 h: it and the later ones stay.
    plan = plan_retention(segs([90, 80, 75, 1]), now_ms=NOW, retention_ms=72 * HOUR_MS,
                          disk_used_ratio=0.1, high_water_ratio=0.85,
                          retention_of=lambda seg: 100 * HOUR_MS if seg.start_offset == SEG
                          else 72 * HOUR_MS)
    assert [seg.start_offset // SEG for seg in plan.segments] == [0]
    plan = plan_retention(segs([90, 80, 1]), now_ms=NOW, retention_ms=72 * HOUR_MS,
                          disk_used_ratio=0.1, high_water_ratio=0.85, retention_of=lambda _s: -1)
    assert plan.segments == ()


def test_bad_topic_retention() -> None:
    with pytest.raises(StoreError):
        TopicRetention(retention_ms=-5)
    with pytest.raises(StoreError):
        TopicRetention(retention_bytes=-1)


def test_size_retention_across_runs_matches_a_recount(tmp_path: Path) -> None:
    # Runs between puts keep a running total; each must agree with summing from scratch.
    limit = 100_000
    sized = {"small": TopicRetention(retention_bytes=limit)}
    with _open(tmp_path) as s:
        for round_ in range(12):
            for i in range(7):
                s.put(MessageIn("small", 0, b"y" * (1000 + 1700 * ((round_ * 7 + i) % 9))))
                if i == 3:
                    _put(s, "keep", 1)
            lo, hi = s.min_offset("small", 0), s.max_offset("small", 0)  # (dispatches)
            cq = s._cqs.find("small", 0)
            assert cq is not None
            sizes = [size for _phy, size, _tag in cq.get(lo, hi - lo)]
            want = next(lo + k for k in range(len(sizes) + 1) if sum(sizes[k:]) <= limit)
            s.run_retention(now_ms=int(time.time() * 1000), topics=sized)
            assert s.min_offset("small", 0) == want, round_
        assert s.min_offset("keep", 0) == 0
