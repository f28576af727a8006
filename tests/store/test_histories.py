"""Queue histories (issue 16): local runs and epochs mapped to queue offsets, and divergence."""
from __future__ import annotations

from pathlib import Path

import pytest
from ferry.errors import StoreError
from ferry.store import GetStatus, MessageIn, MessageStore, StoreConfig
from ferry.store.checkpoint import Checkpoint, read_checkpoint, write_checkpoint
from ferry.store.epochs import EpochLog
from ferry.store.histories import HISTORIES, QueueHistory, StoreHistories

SMALL = dict(commitlog_segment_bytes=256 * 1024, max_message_bytes=16 * 1024,
             cq_entries_per_segment=64, index_max_slots=64, index_max_entries=256)


def _store(root: Path) -> MessageStore:
    return MessageStore(StoreConfig(root_dir=str(root), **SMALL))  # type: ignore[arg-type]


def _put(store: MessageStore, topic: str, n: int, queue_id: int = 0) -> None:
    store.put_batch([MessageIn(topic=topic, queue_id=queue_id, body=b"x%d" % i) for i in range(n)])


def test_queue_history_lookups() -> None:
    qh = QueueHistory(["La", "E3", "E4", "E5"], [0, 10, 10, 25])
    assert qh.id_at(0) == "La" and qh.id_at(9) == "La"
    assert qh.id_at(10) == "E4"   # E3 holds nothing of this queue
    assert qh.id_at(30) == "E5" and qh.starts[-1] == 25
    assert qh.end_of_history_at(3) == 10 and qh.end_of_history_at(24) == 25
    assert qh.end_of_history_at(25) is None
    # A reader past the end of its history goes back there; within it stays.
    assert qh.divergence("La", 12, 0, 40) == 10
    assert qh.divergence("La", 10, 0, 40) is None
    assert qh.divergence("E5", 40, 0, 40) is None
    # Past the end of the open history: this replica has not caught up, no rewind.
    assert qh.divergence("E5", 45, 0, 40) is None


def test_unknown_histories_rewind_only_when_lost() -> None:
    qh = QueueHistory(["La", "E3", "E4", "E5"], [0, 10, 10, 25])
    # A newer term than any here (a slave not synced yet): not caught up, no rewind.
    assert qh.divergence("E6", 45, 0, 40) is None
    # An older term this replica never had: lost here, back to the oldest record.
    assert qh.divergence("E2", 45, 0, 40) == 0
    assert qh.divergence("E2", 45, 7, 40) == 7
    # Another replica's local run: the records before the first epoch.
    assert qh.divergence("Lzz", 45, 0, 40) == 10
    assert qh.divergence("Lzz", 8, 0, 40) is None
    # Without epochs an unknown run was lost with the disk: the oldest stored offset.
    local = QueueHistory(["La", "Lb"], [0, 20])
    assert local.divergence("Lzz", 45, 0, 40) == 0
    assert local.divergence("Lzz", 45, 7, 40) == 7
    assert local.divergence("E1", 45, 3, 40) == 3


def test_new_store_starts_a_run_and_a_clean_reopen_keeps_it(tmp_path: Path) -> None:
    with _store(tmp_path) as s:
        first = s.histories.runs
        _put(s, "t", 5)
        assert len(first) == 1 and first[0][1] == 0
        assert s.queue_history("t", 0).id_at(4) == s.queue_history("t", 0).ids[0]
    with _store(tmp_path) as s:
        assert s.histories.runs == first   # clean close: the same history goes on


def test_lost_directory_is_a_new_unknown_history(tmp_path: Path) -> None:
    with _store(tmp_path / "a") as s:
        _put(s, "t", 5)
        old = s.queue_history("t", 0).id_at(4)
    with _store(tmp_path / "b") as s:   # the disk was replaced: an empty store
        _put(s, "t", 3)
        qh = s.queue_history("t", 0)
        assert old not in qh.ids
        assert qh.divergence(old or "", 5, 0, 3) == 0


def test_unclean_open_starts_a_new_run_at_the_log_end(tmp_path: Path) -> None:
    with _store(tmp_path) as s:
        _put(s, "t", 5)
        _put(s, "u", 2)
        end = s.commit_log_max_offset
    cp = read_checkpoint(str(tmp_path))   # as after a crash: no clean-shutdown mark
    assert cp is not None
    write_checkpoint(str(tmp_path), Checkpoint(cp.commit_offset, cp.dispatch_offset, False))
    with _store(tmp_path) as s2:
        runs = s2.histories.runs
        assert len(runs) == 2 and runs[1][1] == end
        _put(s2, "t", 4)
        qh = s2.queue_history("t", 0)
        assert qh.starts == [0, 5]
        old = qh.ids[0]
        assert qh.divergence(old, 5, 0, 9) is None       # read all of it: continues
        assert qh.divergence(old, 7, 0, 9) == 5          # saw a tail that was replaced
        got = s2.get_messages("t", 0, 3, 32, stop_offset=qh.end_of_history_at(3))
        assert got.status is GetStatus.FOUND and got.next_queue_offset == 5


def test_epochs_take_over_after_the_first_epoch(tmp_path: Path) -> None:
    with _store(tmp_path) as s:
        epochs = EpochLog(str(tmp_path))
        s.histories.use_epochs(epochs)
        _put(s, "t", 3)
        epochs.append(7, s.commit_log_max_offset)
        _put(s, "t", 2)
        _put(s, "u", 1)
        epochs.append(9, s.commit_log_max_offset)
        _put(s, "t", 4)
        qh = s.queue_history("t", 0)
        assert qh.ids[1:] == ["E7", "E9"] and qh.starts == [0, 3, 5]
        assert s.queue_history("u", 0).starts == [0, 0, 1]
        # A truncation (a slave following a new master) moves the boundaries.
        cut_at = epochs.entries[1][1]
        s.truncate_to(cut_at)
        epochs.truncate_from(cut_at)
        assert s.queue_history("t", 0).ids[1:] == ["E7"]
        assert s.histories.runs[-1][1] == cut_at   # a local run from the cut, below E7's reign


def test_truncation_without_epochs_starts_a_new_run(tmp_path: Path) -> None:
    with _store(tmp_path) as s:
        _put(s, "t", 3)
        cut_at = s.commit_log_max_offset
        _put(s, "t", 4)
        old = s.queue_history("t", 0).ids[0]
        s.truncate_to(cut_at)
        _put(s, "t", 2)
        qh = s.queue_history("t", 0)
        assert qh.ids[0] == old and qh.starts == [0, 3]
        assert qh.divergence(old, 7, 0, 5) == 3   # a reader of the cut tail goes back to 3


def test_created_ms_marks_a_store_that_started_empty(tmp_path: Path) -> None:
    with _store(tmp_path / "a") as s:
        created = s.histories.created_ms
        assert created > 0
    with _store(tmp_path / "a") as s:
        assert s.histories.created_ms == created


def test_bad_history_file_is_a_store_error(tmp_path: Path) -> None:
    (tmp_path / HISTORIES.name).write_bytes(b"garbage-garbage-garbage")
    with pytest.raises(StoreError):
        StoreHistories(str(tmp_path), 0, True)
